// The caller side of the owner protocol: requests of owned operations straight to their
// owner, one hop instead of two (shared subject → any actor → owner). The routing policy a
// process hands in says how an owner is found per placement (task objects: the name's lease);
// one without a lookup goes through the shared subject. An owner is looked up once per key
// (again after 5 s) and forgotten as soon as it does not answer a request. A request the owner
// leaves unanswered is hedged: sent on, naming the silent owner, to a process known to answer,
// else through the shared subject (whose queue group still includes the silent process), in
// short attempts, since either may be silent too; the process that will take the name over says
// so, then holds the request until its claim (the lease's compare-and-set fences out the old
// owner) and answers it, within the budget.
import { performance } from "node:perf_hooks";
import { LRUCache } from "lru-cache";
import {
  ANONYMOUS,
  PRINCIPAL_HEADER,
  sendsPrincipal,
  viaGateway,
  ownerKey,
  ownerSubject,
  requestSubject,
  KEY_FRESH_HEADER,
  TakeoverPending,
  type Operation,
  type OperationReply,
  type OwnedPlacement,
} from "../schemas/index.ts";
import { BUDGET_HEADER, SUSPECT_HEADER } from "./headers.ts";
import { send, type Sender } from "./send.ts";

/**
 * Resolves the id of the process owning `principal`'s `key` (a name, a record id); undefined
 * when none holds it.
 */
export type OwnerLookup = (key: string, principal: string) => Promise<string | undefined>;

/** How owners are found, per placement; operations of a placement without a lookup use the shared subject. */
export type RoutingPolicy = { readonly [Kind in OwnedPlacement["kind"]]?: OwnerLookup };

export interface OwnerRouting {
  /**
   * Sends the request to the name's owner when one is known; when it does not answer, hedges
   * it (see above) within `budgetMs`. Undefined when nothing served it: then use the shared subject.
   * Once an attempt went unanswered, `headers` no longer holds `KEY_FRESH_HEADER`, so the
   * caller's own attempts after this one are checked too.
   */
  tryOwner(
    op: Operation,
    input: Record<string, unknown>,
    body: string,
    headers: Record<string, string>,
    budgetMs: number,
  ): Promise<OperationReply | undefined>;
}

// A live owner answers in milliseconds; one that does not answer within this is passed over.
const DIRECT_ATTEMPT_MS = 500;
// An owner that failed a direct request is not tried directly again for this long.
const SUSPECT_MS = 3_000;
const OWNER_TTL_MS = 5_000;
// A hedge's attempt before a taker is known (at a process that answered lately, or through the
// shared subject): a live actor answers or names the taker in milliseconds.
const HEDGE_ATTEMPT_MS = 500;

export function ownerRouting(nats: Sender, policy: RoutingPolicy, prefix: string, maxNames = 100_000): OwnerRouting {
  // Looked up again after a while: a process that lost a name still serves it, by forwarding.
  const owners = new LRUCache<string, string>({ max: maxNames, ttl: OWNER_TTL_MS });
  const suspects = new LRUCache<string, true>({ max: 1_000, ttl: SUSPECT_MS });
  /** Processes that answered lately. */
  const answering = new LRUCache<string, true>({ max: 1_000, ttl: 10_000 });
  const lookups = new Map<string, Promise<string | undefined>>();

  /** The owner of `principal`'s `key` (cache key `id`), known or looked up once for every request waiting on it. */
  const ownerOf = (
    find: OwnerLookup,
    id: string,
    key: string,
    principal: string,
  ): string | undefined | Promise<string | undefined> => {
    const known = owners.get(id);
    if (known) return known;
    let lookup = lookups.get(id);
    if (!lookup) {
      lookup = find(key, principal)
        .then((owner) => {
          if (owner) owners.set(id, owner);
          return owner;
        })
        .catch(() => undefined) // no hint: the shared subject still works
        .finally(() => lookups.delete(id));
      lookups.set(id, lookup);
    }
    return lookup;
  };

  /** One attempt at `subject`; undefined when nobody answered (gone, or silent for `timeoutMs`). */
  function attemptAt(subject: string, body: string, headers: Record<string, string>, timeoutMs: number) {
    // No responders (the process is gone), a timeout (paused) or a lost connection.
    return send(nats, subject, body, { timeoutMs, noRespondersMs: 0, headers }).catch(() => undefined);
  }

  /** One attempt at `owner`'s own subject; undefined when it did not answer. */
  async function attempt(
    owner: string,
    op: Operation,
    input: Record<string, unknown>,
    body: string,
    headers: Record<string, string>,
    timeoutMs: number,
  ) {
    const reply = await attemptAt(ownerSubject(op, owner, input, prefix), body, headers, timeoutMs);
    if (reply) answering.set(owner, true);
    else {
      suspects.set(owner, true);
      answering.delete(owner);
    }
    return reply;
  }

  /**
   * Whether a request can leave now. While the connection is down `send` refuses at once,
   * without awaiting anything but promises: attempts made in a loop then never yield to the
   * event loop, and would hold it (and with it the reconnect) for the whole budget.
   */
  const canSend = () => !nats.connected || nats.connected();

  /** A process that answered lately and is not suspect, other than `not`. */
  function someAnswering(not: string | undefined): string | undefined {
    const candidates = [...answering.keys()].filter((o) => o !== not && !suspects.has(o));
    return candidates[Math.floor(Math.random() * candidates.length)];
  }

  /** The process a TakeoverPending answer names, if the reply is one. */
  function taker(reply: OperationReply): string | undefined {
    if (reply.status !== TakeoverPending.status) return undefined;
    const body = JSON.parse(Buffer.from(reply.data).toString("utf8")) as { _tag?: string; process?: string };
    return body._tag === TakeoverPending.tag ? body.process : undefined;
  }

  /**
   * The silent owner's request, sent on: first to a process that answered lately, else through
   * the shared subject, each for a short attempt (it may be silent too); the process a
   * `TakeoverPending` answer names as the name's next holder then gets the time left, which it
   * may spend waiting for its claim.
   */
  async function hedge(
    op: Operation,
    input: Record<string, unknown>,
    body: string,
    headers: Record<string, string>,
    silent: string,
    left: () => number,
  ) {
    let target = someAnswering(silent);
    let taking = false;
    while (left() > 1 && canSend()) {
      const budget = Math.floor(taking ? left() : Math.min(left(), HEDGE_ATTEMPT_MS));
      const hedged = { ...headers, [SUSPECT_HEADER]: silent, [BUDGET_HEADER]: String(budget) };
      // The shared subject the gateway may send on: its copy, where the principal is believed.
      const reply = target
        ? await attempt(target, op, input, body, hedged, budget)
        : await attemptAt(
            requestSubject(sendsPrincipal(op) ? viaGateway(op) : op, input, prefix),
            body,
            hedged,
            budget,
          );
      if (!reply) {
        // Silent too, or the shared subject reached a silent process: again, elsewhere.
        target = undefined;
        taking = false;
        continue;
      }
      const next = taker(reply);
      if (next === undefined) return reply;
      if (next === target && taking) return undefined; // the takeover comes after the time left
      answering.set(next, true);
      target = next;
      taking = true;
    }
    return undefined;
  }

  return {
    async tryOwner(op, input, body, headers, budgetMs) {
      const kind = op.placement.kind;
      const find = kind === "stateless" ? undefined : policy[kind];
      // Not connected: the caller's own send answers 503 at once (see `canSend`).
      if (!find || !canSend()) return undefined;
      const started = performance.now();
      const left = () => budgetMs - (performance.now() - started);
      const key = ownerKey(op, input);
      // Two principals' names are two objects, each with its own owner.
      const principal = headers[PRINCIPAL_HEADER] ?? ANONYMOUS;
      const id = `${kind}\0${principal}\0${key}`;
      const owner = await ownerOf(find, id, key, principal);
      if (owner && !suspects.has(owner)) {
        const reply = await attempt(owner, op, input, body, headers, Math.min(left(), DIRECT_ATTEMPT_MS));
        if (reply) return reply;
        // The owner may have run it: every later attempt (hedged here, or sent on by the
        // caller with these headers) is checked.
        delete headers[KEY_FRESH_HEADER];
      }
      if (owner === undefined) return undefined; // no lease: any actor claims it
      if (owners.get(id) === owner) owners.delete(id);
      return hedge(op, input, body, headers, owner, left);
    },
  };
}

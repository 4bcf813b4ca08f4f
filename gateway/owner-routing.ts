// Task-object requests straight to the process holding the name's lease: one hop instead of
// two (shared subject → any actor → owner). The owner is read from the lease bucket once per
// name (again after 5 s) and forgotten as soon as it does not answer a request. While an
// owner is silent, its names' requests go to another process known to answer (it routes them, and takes the names
// over when their leases lapse), not to the shared subject, whose queue group still
// includes the silent process; with no such process known, the shared subject.
import { headers as natsHeaders } from "@nats-io/transport-node";
import { LRUCache } from "lru-cache";
import { leaseOwner, ownerSubject } from "../actors/index.ts";
import type { NatsHandle, VersionedStore } from "../platform/index.ts";
import { ERROR_CODE_HEADER, nameToken, type Operation } from "../schemas/index.ts";
import type { ActorReply } from "./transport.ts";

export interface OwnerRouting {
  /**
   * Sends the request to the name's owner when one is known, else to a process known to
   * answer. Undefined when neither served it (gone or silent): then use the shared subject.
   */
  tryOwner(op: Operation, input: Record<string, unknown>, body: string, headers: Record<string, string>, timeoutMs: number): Promise<ActorReply | undefined>;
}

/** Operations placed by name (their subject names a task object). */
export const isPlaced = (op: Operation) => op.subject.startsWith("taskobjects.{name}.");

// A live owner answers in milliseconds; one that does not answer within this is passed over.
const DIRECT_ATTEMPT_MS = 500;
// An owner that failed a direct request is not tried directly again for this long.
const SUSPECT_MS = 3_000;
const OWNER_TTL_MS = 5_000;

export function ownerRouting(nats: NatsHandle, leases: VersionedStore, prefix: string, maxNames = 100_000): OwnerRouting {
  // Read again after a while: a process that lost a name still serves it, by forwarding.
  const owners = new LRUCache<string, string>({ max: maxNames, ttl: OWNER_TTL_MS });
  const suspects = new LRUCache<string, true>({ max: 1_000, ttl: SUSPECT_MS });
  /** Processes that answered lately. */
  const answering = new LRUCache<string, true>({ max: 1_000, ttl: 10_000 });
  const lookups = new Map<string, Promise<string | undefined>>();

  const ownerOf = (name: string): string | undefined | Promise<string | undefined> => {
    const known = owners.get(name);
    if (known) return known;
    let lookup = lookups.get(name);
    if (!lookup) {
      lookup = leases
        .get(nameToken(name))
        .then((entry) => {
          const owner = leaseOwner(entry.value);
          if (owner) owners.set(name, owner);
          return owner;
        })
        .catch(() => undefined) // no hint: the shared subject still works
        .finally(() => lookups.delete(name));
      lookups.set(name, lookup);
    }
    return lookup;
  };

  /** One attempt at `owner`'s own subject; undefined when it did not answer. */
  async function attempt(owner: string, op: Operation, input: Record<string, unknown>, body: string, headers: Record<string, string>, timeoutMs: number) {
    const h = natsHeaders();
    for (const [k, v] of Object.entries(headers)) h.set(k, v);
    try {
      const msg = await nats.requester.request(ownerSubject(op, owner, input, prefix), body, timeoutMs, h);
      answering.set(owner, true);
      const code = msg.headers?.get(ERROR_CODE_HEADER);
      return { status: code ? Number(code) : 200, data: msg.data };
    } catch {
      // No responders (the process is gone), a timeout (paused) or a lost connection.
      suspects.set(owner, true);
      answering.delete(owner);
      return undefined;
    }
  }

  /** A process that answered lately and is not suspect, other than `not`. */
  function someAnswering(not: string | undefined): string | undefined {
    const candidates = [...answering.keys()].filter((o) => o !== not && !suspects.has(o));
    return candidates[Math.floor(Math.random() * candidates.length)];
  }

  return {
    async tryOwner(op, input, body, headers, timeoutMs) {
      const name = String(input.name ?? "default");
      const owner = await ownerOf(name);
      if (owner && !suspects.has(owner)) {
        const reply = await attempt(owner, op, input, body, headers, Math.min(timeoutMs, DIRECT_ATTEMPT_MS));
        if (reply) return reply;
      }
      if (owner && owners.get(name) === owner) owners.delete(name);
      const other = someAnswering(owner);
      return other === undefined ? undefined : attempt(other, op, input, body, headers, timeoutMs);
    },
  };
}

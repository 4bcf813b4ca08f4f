// The owner side of leased keys (placement `byName`: task objects): the process holding a key's
// lease runs its requests; any other passes a request on to the owner's own subject (once: a
// request passed on already is answered NotOwner, no loops) and relays its answer, or waits for
// a takeover. Keyed by principal and lease key, so any kind of leased thing is placed this way.
import { performance } from "node:perf_hooks";
import {
  ApiError,
  GatewayTimeout,
  IDEMPOTENCY_KEY_HEADER,
  KEY_FRESH_HEADER,
  NotOwner,
  ownerSubject,
  PRINCIPAL_HEADER,
  REQUEST_ID_HEADER,
  requestBody,
  ServiceUnavailable,
  TakeoverPending,
  type Operation,
  type Answer,
} from "../schemas/index.ts";
import { recordForward } from "../platform/index.ts";
import { FORWARDED_HEADER, holdBudget, SUSPECT_HEADER } from "./headers.ts";
import { LeaseLost, type Activation, type Placement } from "./leases.ts";
import { noAnswer, nobodyThere, send, answerOf, type Sender } from "./send.ts";
import type { HandlerContext, OwnerStrategy } from "./types.ts";

export interface LeasedOwnersOptions {
  placement: Placement;
  /** Carries forwards to the owning process. */
  sender: Sender;
  /** Subject prefix shared with every process. */
  prefix: string;
  /** The lease key of `op`'s request by `principal` (e.g. `taskObjectLeaseKey`). */
  leaseKey(op: Operation, input: Record<string, unknown>, principal: string): string;
  /** Time a request may spend reaching its owner (default 1.2 s, under the gateway's 1.5 s attempt). */
  routeBudgetMs?: number;
}

// One forward attempt: a live owner answers in milliseconds; a paused one never does.
const FORWARD_ATTEMPT_MS = 500;
const WAIT_RECHECK_MS = 200;

/** The owners of leased keys: requests run where the key's lease is held (see above). */
export function leasedOwners(options: LeasedOwnersOptions): OwnerStrategy<Activation> {
  const { placement } = options;
  const budgetMs = options.routeBudgetMs ?? 1_200;

  /**
   * One forward to `owner`: its answer, or `moved` when it says it holds the key no more; its
   * error answer thrown as the `ApiError` it carries.
   */
  async function forward(
    owner: string,
    op: Operation,
    input: Record<string, unknown>,
    context: HandlerContext,
    timeoutMs: number,
  ): Promise<Answer<unknown> | "moved"> {
    const reply = await send(options.sender, ownerSubject(op, owner, input, options.prefix), requestBody(op, input), {
      timeoutMs,
      noRespondersMs: 0,
      span: `forward ${op.name}`,
      headers: {
        [IDEMPOTENCY_KEY_HEADER]: context.idempotencyKey,
        [KEY_FRESH_HEADER]: context.keyFresh ? "1" : undefined,
        [REQUEST_ID_HEADER]: context.headers?.get(REQUEST_ID_HEADER),
        [FORWARDED_HEADER]: "1",
        // Only actors and gateways publish owners' subjects: the owner believes it.
        [PRINCIPAL_HEADER]: context.principal,
      },
    });
    try {
      return answerOf(reply);
    } catch (err) {
      if (err instanceof ApiError && err._tag === NotOwner.tag) return "moved";
      throw err;
    }
  }

  return {
    ownerId: placement.ownerId,
    ownQueue: `owner.${placement.ownerId}`,
    endpointSuffix: "-owner",
    // Actors and gateways send the caller's principal along to the owner.
    principal: (msg) => msg.headers?.get(PRINCIPAL_HEADER) || undefined,
    /** Runs `work` where the key lives: here if this process holds it, else at its owner. */
    async route(op, input, context, _own, work) {
      const object = options.leaseKey(op, input, context.principal);
      const mayForward = !context.headers?.has(FORWARDED_HEADER);
      // A gateway's hedge: the owner it names did not answer it; wait for the takeover here.
      const hedged = context.headers?.get(SUSPECT_HEADER) || undefined;
      const deadline = performance.now() + holdBudget(context.headers, budgetMs);
      let suspect = hedged;
      let outcomeUnknown = false;
      // The request as this attempt sends or runs it: one after an attempt that may have written is checked.
      let attempt = context;
      const checked = () => (attempt = { ...attempt, keyFresh: false });
      for (;;) {
        const route = await placement.route(object, suspect);
        if (route.kind === "local") {
          try {
            // Records never change once created: reads and creates of a name commute, so they
            // need no mailbox, and concurrent creates share fences (Placement.fence).
            return await placement.run(route.activation, (activation) => work(activation, attempt), {
              exclusive: false,
            });
          } catch (err) {
            if (!(err instanceof LeaseLost)) throw err;
            // It may have written before its lease was found gone: the next attempt is checked.
            checked();
          }
        } else if (!mayForward) {
          throw NotOwner.make({});
        } else if (route.kind === "remote") {
          const timeout = Math.max(1, Math.min(FORWARD_ATTEMPT_MS, deadline - performance.now()));
          try {
            const answer = await forward(route.owner, op, input, attempt, timeout);
            if (answer !== "moved") {
              recordForward("answered");
              return answer as Awaited<ReturnType<typeof work>>;
            }
            recordForward("moved");
            placement.forget(object);
            suspect = undefined;
          } catch (err) {
            if (nobodyThere(err)) recordForward("no_responders");
            else if (noAnswer(err)) recordForward("timeout");
            else throw err;
            outcomeUnknown ||= noAnswer(err);
            // The owner may have run it: the next attempt is checked.
            if (noAnswer(err)) checked();
            suspect = route.owner;
          }
        } else if (hedged && route.until > deadline) {
          // The takeover comes after the sender stops waiting: tell it who will hold the name.
          throw TakeoverPending.make({ process: placement.ownerId });
        } else {
          // Read the lease again now and then: a release lets the name be claimed at once.
          const pause = Math.min(route.until, deadline, performance.now() + WAIT_RECHECK_MS) - performance.now();
          if (pause > 0) await new Promise((r) => setTimeout(r, pause));
        }
        // A forward that timed out may still have run at the owner: its outcome is unknown.
        if (performance.now() >= deadline) throw outcomeUnknown ? GatewayTimeout.make({}) : ServiceUnavailable.make({});
      }
    },
  };
}

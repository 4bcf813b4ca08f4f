// The caller's one entry: a request of an operation sent where it runs. An owned operation's
// repeatable request goes straight to its key's owner when the routing policy finds one (hedged
// when it is silent: caller.ts); every other request, or one the owner did not serve, goes on
// the operation's shared subject, where any process of its role takes it (and routes it on).
import { performance } from "node:perf_hooks";
import {
  GatewayTimeout,
  isOwned,
  PRINCIPAL_HEADER,
  requestBody,
  requestSubject,
  sendsPrincipal,
  viaGateway,
  type Operation,
  type OperationReply,
} from "../schemas/index.ts";
import { ownerRouting, type RoutingPolicy } from "./caller.ts";
import { send, type Sender, type SendOptions } from "./send.ts";

/** How long a dispatched request may take. */
export interface Budget {
  /** Time for the answer, every attempt included. */
  timeoutMs: number;
  /** A request that waits (RunMicrovm's `wait`, a long poll) has this much more time, in one attempt. */
  waitMs?: number;
  /** Time for one attempt of a repeatable request (a read, a create with an idempotency key). */
  attemptMs?: number;
  /** A request its receiver may hold open, given up when its signal aborts (`SendOptions.held`). */
  held?: SendOptions["held"];
}

/**
 * Sends `input` of `op` with `headers` where it runs, within `budget`. Once an attempt went
 * unanswered, `headers` no longer holds `KEY_FRESH_HEADER`.
 */
export type Dispatch = (
  op: Operation,
  input: Record<string, unknown>,
  headers: Record<string, string>,
  budget: Budget,
) => Promise<OperationReply>;

/** The dispatch of a process that sends on `sender`; `policy`: how it finds owners (none: shared subjects only). */
export function dispatcher(sender: Sender, prefix: string, policy?: RoutingPolicy): Dispatch {
  const owners = policy && ownerRouting(sender, policy, prefix);
  return async (op, input, headers, budget) => {
    const started = performance.now();
    const body = requestBody(op, input);
    const repeatable = op.http.method === "GET" || op.idempotent === true;
    // An unanswered request to an owner is sent on (hedged): only a repeatable one may be.
    const direct =
      owners && repeatable && isOwned(op)
        ? await owners.tryOwner(op, input, body, headers, budget.timeoutMs)
        : undefined;
    if (direct) return direct;
    // Who asks (`Microvm-Principal`), where the contract's API takes it: only on the subjects
    // that only the gateway may publish.
    const target = sendsPrincipal(op) ? viaGateway(op) : op;
    return send(sender, requestSubject(target, input, prefix), body, {
      timeoutMs: Math.max(1, budget.timeoutMs + (budget.waitMs ?? 0) - (performance.now() - started)),
      attemptMs: repeatable && budget.waitMs === undefined ? budget.attemptMs : undefined,
      headers,
      held: budget.held,
    });
  };
}

/** An operation this process also serves itself (actors or a microVM host beside the gateway). */
export interface InProcessRoute {
  /** Whether the request is best served here (e.g. the object it calls is active here). */
  here(input: Record<string, unknown>, principal: string): boolean;
  /**
   * Serves it here, as its NATS subject would (`inProcessOperation`): `headers` are the ones the
   * request would carry, its caller's principal among them.
   */
  call(input: Record<string, unknown>, headers: Readonly<Record<string, string>>): Promise<OperationReply>;
}

/**
 * `dispatch`, but a request that one of `routes` (by operation name) says is best served in this
 * process is served here, without the trip through NATS and back, within the same budget (past
 * it: 504 GatewayTimeout, as a request unanswered over NATS); every other goes as before. Only a
 * request that names its principal (the subjects only a gateway may publish) and that its
 * client does not hold open (`Budget.held`) is.
 */
export function withInProcess(
  dispatch: Dispatch,
  routes: ReadonlyMap<string, InProcessRoute> | undefined,
  connected?: () => boolean,
): Dispatch {
  if (!routes || routes.size === 0) return dispatch;
  return (op, input, headers, budget) => {
    const route = routes.get(op.name);
    const principal = headers[PRINCIPAL_HEADER];
    // Without NATS (`connected` false) `dispatch` answers at once (503), as it does for any request:
    // served here, the handler's own writes would wait for the connection instead.
    if (
      !route ||
      principal === undefined ||
      budget.held ||
      (connected && !connected()) ||
      !route.here(input, principal)
    )
      return dispatch(op, input, headers, budget);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(GatewayTimeout.make({})), budget.timeoutMs + (budget.waitMs ?? 0));
    });
    return Promise.race([route.call(input, headers), late]).finally(() => clearTimeout(timer));
  };
}

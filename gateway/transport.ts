// Forwarding a request to the actors over NATS, mapping transport trouble to 503 / 504.
import { headers as natsHeaders, type Msg, type MsgHdrs } from "@nats-io/transport-node";
import {
  holdRequest,
  injectTrace,
  isNoResponders,
  isTimeout,
  leanReply,
  SpanKind,
  traced,
  type NatsHandle,
} from "../platform/index.ts";
import {
  GatewayTimeout,
  KEY_FRESH_HEADER,
  replyOf,
  ServiceUnavailable,
  type OperationReply,
} from "../schemas/index.ts";

export interface ForwardOptions {
  /** Total time for the request, retries included. */
  timeoutMs: number;
  /**
   * Time for one attempt when the request is safe to repeat (a read, or a create with an
   * idempotency key): an actor that died with the request is then retried on another.
   */
  attemptMs?: number;
  /** Headers to send (e.g. `Idempotency-Key`). */
  headers?: Record<string, string>;
  /**
   * A request the actor may hold open (a long poll): given up when `signal` aborts (its client
   * left), and the actor told so (`holdRequest`). The request then rejects with the abort.
   */
  held?: { signal: AbortSignal; prefix: string };
}

const RETRY_PAUSE_MS = 100;
/** How long "no responders" is retried before answering 503 (actors restarting). */
const NO_RESPONDERS_WAIT_MS = 1_000;

/**
 * Sends a request. Not connected, or the connection lost while waiting → 503 at once (the
 * client library drops requests while disconnected). No responders → retried for up to a
 * second, then 503. A repeatable request whose attempt times out is sent again with the
 * same headers; the last timeout → 504 (the outcome is unknown).
 */
export function forward(
  nats: NatsHandle,
  subject: string,
  body: string,
  options: ForwardOptions,
): Promise<OperationReply> {
  return traced(`request ${subject}`, SpanKind.CLIENT, undefined, () => send(nats, subject, body, options));
}

async function send(nats: NatsHandle, subject: string, body: string, options: ForwardOptions): Promise<OperationReply> {
  const h = natsHeaders();
  for (const [k, v] of Object.entries(options.headers ?? {})) h.set(k, v);
  // The handler's span is a child of this request's.
  injectTrace(h);
  const { held } = options;
  if (!held) return attempts(nats, subject, body, options, h);
  const stopHolding = holdRequest(nats.nc, held.prefix, h, held.signal);
  try {
    return await attempts(nats, subject, body, options, h);
  } finally {
    stopHolding();
  }
}

async function attempts(
  nats: NatsHandle,
  subject: string,
  body: string,
  options: ForwardOptions,
  h: MsgHdrs,
): Promise<OperationReply> {
  const start = Date.now();
  const deadline = start + options.timeoutMs;
  const noRespondersUntil = Math.min(deadline, start + NO_RESPONDERS_WAIT_MS);
  for (;;) {
    if (!nats.connected()) throw ServiceUnavailable.make({});
    const remaining = deadline - Date.now();
    const timeout = Math.max(1, Math.min(remaining, options.attemptMs ?? remaining));
    let msg: Msg;
    try {
      msg = await nats.requester.request(subject, body, timeout, h, options.held?.signal);
    } catch (err) {
      if (options.held?.signal.aborted) throw err;
      // An attempt that may have been received: the next one is checked (KEY_FRESH_HEADER).
      h.delete(KEY_FRESH_HEADER);
      if (isNoResponders(err) && Date.now() + RETRY_PAUSE_MS < noRespondersUntil) {
        await new Promise((r) => setTimeout(r, RETRY_PAUSE_MS));
        continue;
      }
      const timedOut = isTimeout(err);
      if (timedOut && deadline - Date.now() > RETRY_PAUSE_MS) continue;
      if (timedOut) throw GatewayTimeout.make({}, { cause: err });
      // No responders for long, the connection lost while waiting, a publish refused.
      throw ServiceUnavailable.make({}, { cause: err });
    }
    return replyOf(leanReply(msg));
  }
}

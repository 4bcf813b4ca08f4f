// The one sender of requests to other processes over NATS: a gateway's to the actors, a caller's
// to an owner, a process's onward to the owner of a key. Transport trouble is told as the
// caller answers it: 503 (nobody there, not connected) or 504 (no answer in time: the outcome
// is unknown), with the transport failure as its cause.
import { headers as natsHeaders, type Msg, type MsgHdrs, type NatsConnection } from "@nats-io/transport-node";
import { holdRequest, injectTrace, isNoResponders, isTimeout, leanReply, SpanKind, traced } from "../platform/index.ts";
import {
  ApiError,
  GatewayTimeout,
  KEY_FRESH_HEADER,
  replyOf,
  ServiceUnavailable,
  StoredAnswer,
  type Answer,
  type OperationReply,
} from "../schemas/index.ts";

/** Request/reply as the platform's `Requester` does it. */
export interface Requests {
  request(subject: string, data: string, timeoutMs: number, headers?: MsgHdrs, signal?: AbortSignal): Promise<Msg>;
}

/** Where requests leave: a requester, and (a gateway's) whether its connection is up. */
export interface Sender {
  readonly nc: NatsConnection;
  readonly requester: Requests;
  connected?(): boolean;
}

/** A connection's own request/reply as a `Sender`. */
export function natsSender(nc: NatsConnection): Sender {
  return {
    nc,
    requester: { request: (subject, data, timeout, h) => nc.request(subject, data, { timeout, headers: h }) },
  };
}

export interface SendOptions {
  /** Total time for the request, every attempt included. */
  timeoutMs: number;
  /**
   * Time for one attempt when the request is safe to repeat (a read, or a create with an
   * idempotency key): an attempt unanswered in it is sent again. Default: one attempt.
   */
  attemptMs?: number;
  /** How long "no responders" is tried again (default 1 s: processes restarting; 0: not). */
  noRespondersMs?: number;
  /** Headers to send; an undefined one is left out. */
  headers?: Readonly<Record<string, string | undefined>>;
  /**
   * A request the receiver may hold open (a long poll): given up when `signal` aborts (its client
   * left), and the receiver told so (`holdRequest`). The request then rejects with the abort.
   */
  held?: { signal: AbortSignal; prefix: string };
  /** The client span's name (default `request <subject>`). */
  span?: string;
}

const RETRY_PAUSE_MS = 100;
const NO_RESPONDERS_WAIT_MS = 1_000;

/**
 * Sends a request and resolves with its reply as it came (status, bytes, stored record). Not
 * connected, or the connection lost while waiting → 503 at once. No responders → tried again
 * for `noRespondersMs`, then 503. A repeatable request whose attempt times out is sent again with
 * the same headers, less `KEY_FRESH_HEADER` (the first may have written); the last timeout → 504.
 */
export function send(sender: Sender, subject: string, body: string, options: SendOptions): Promise<OperationReply> {
  return traced(options.span ?? `request ${subject}`, SpanKind.CLIENT, undefined, () => {
    const h = natsHeaders();
    for (const [name, value] of Object.entries(options.headers ?? {})) if (value) h.set(name, value);
    // The receiver's span is a child of this request's.
    injectTrace(h);
    const { held } = options;
    if (!held) return attempts(sender, subject, body, options, h);
    const stopHolding = holdRequest(sender.nc, held.prefix, h, held.signal);
    return attempts(sender, subject, body, options, h).finally(stopHolding);
  });
}

async function attempts(
  sender: Sender,
  subject: string,
  body: string,
  options: SendOptions,
  h: MsgHdrs,
): Promise<OperationReply> {
  const start = Date.now();
  const deadline = start + options.timeoutMs;
  const noRespondersUntil = Math.min(deadline, start + (options.noRespondersMs ?? NO_RESPONDERS_WAIT_MS));
  for (;;) {
    if (sender.connected && !sender.connected()) throw ServiceUnavailable.make({});
    const remaining = deadline - Date.now();
    const timeout = Math.max(1, Math.min(remaining, options.attemptMs ?? remaining));
    let msg: Msg;
    try {
      msg = await sender.requester.request(subject, body, timeout, h, options.held?.signal);
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

/** The failure `send` throws when nobody subscribes to the subject. */
export const nobodyThere = (err: unknown): boolean => err instanceof ApiError && isNoResponders(err.cause);
/** The failure `send` throws when nobody answered in time: the outcome is unknown. */
export const noAnswer = (err: unknown): boolean => err instanceof ApiError && isTimeout(err.cause);

/**
 * A reply as the answer it carries: its value, as the stored record its headers name if one (an
 * owner's answer relayed as it gave it); an error reply is thrown as the `ApiError` it carries.
 */
export function answerOf(reply: OperationReply): Answer<unknown> {
  const body = JSON.parse(Buffer.from(reply.data).toString("utf8")) as unknown;
  if (reply.status !== 200) throw new ApiError(reply.status, body as ConstructorParameters<typeof ApiError>[1]);
  const record = reply.stored?.record;
  const dot = record?.indexOf(".") ?? -1;
  if (!record || dot < 0) return body;
  return new StoredAnswer(body, {
    bucket: record.slice(0, dot),
    key: record.slice(dot + 1),
    revision: reply.stored!.revision,
  });
}

// A request sent on to the owner of an owned operation, on the owner's own subject, and its
// answer relayed: task objects (lease holders) and microVM hosts alike.
import { headers, type Msg, type MsgHdrs, type NatsConnection } from "@nats-io/transport-node";
import { ownerSubject, replyValue, requestBody, type Operation } from "../schemas/index.ts";
import { injectTrace, SpanKind, traced } from "../platform/index.ts";

/** Request/reply as `Requester` does it (an adapter makes one of a connection: `natsRequests`). */
export interface Requests {
  request(subject: string, data: string, timeoutMs: number, headers?: MsgHdrs): Promise<Msg>;
}

/** A connection's own request/reply as `Requests`. */
export function natsRequests(nc: NatsConnection): Requests {
  return { request: (subject, data, timeout, h) => nc.request(subject, data, { timeout, headers: h }) };
}

export interface ForwardOptions {
  /** Time for the owner's answer. */
  timeoutMs: number;
  /** Subject prefix shared with every process. */
  prefix: string;
  /** Headers to send along (request id, idempotency key, principal...). */
  headers?: Readonly<Record<string, string | undefined>>;
  /** Sees the owner's reply headers (e.g. a stored record's `Revision`) before its value is taken. */
  onReply?: (headers: MsgHdrs | undefined) => void;
}

/**
 * Sends `input` of owned `op` to process `ownerId`; resolves with its success value, throws
 * its error reply as the `ApiError` it carries, and a transport failure (timeout, no
 * responders) as it comes.
 */
export async function forwardToOwner<T>(
  requests: Requests,
  op: Operation,
  ownerId: string,
  input: Record<string, unknown>,
  options: ForwardOptions,
): Promise<T> {
  const subject = ownerSubject(op, ownerId, input, options.prefix);
  return traced(`forward ${op.name}`, SpanKind.CLIENT, undefined, async () => {
    const h = headers();
    for (const [name, value] of Object.entries(options.headers ?? {})) if (value) h.set(name, value);
    injectTrace(h);
    const reply = await requests.request(subject, requestBody(op, input), options.timeoutMs, h);
    options.onReply?.(reply.headers);
    return replyValue<T>(reply);
  });
}

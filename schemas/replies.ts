// Decoding operation replies (the NATS micro convention: an error carries its status in the
// `Nats-Service-Error-Code` header and its declared body). The one decoder for every caller;
// structural, so it needs no NATS library here.
import { Type } from "@sinclair/typebox";
import { ApiError } from "./errors.ts";
import type { Operation } from "./types.ts";
import { ERROR_CODE_HEADER, RECORD_HEADER, REVISION_HEADER } from "./subjects.ts";

/** What a decoder reads of a NATS reply message. */
export interface ReplyMessage {
  readonly data: Uint8Array;
  readonly headers?: { get(name: string): string };
  json<T = unknown>(): T;
}

/** An operation's reply: its HTTP status and its JSON bytes, to pass on as they are. */
export interface OperationReply {
  status: number;
  data: Uint8Array;
  /** The stored record the answer is (`<bucket>.<key>`) and its revision, when it is one. */
  stored?: { record: string; revision: number };
}

/** Status and bytes of a reply: 200 unless it carries the error code header. */
export function replyOf(msg: ReplyMessage): OperationReply {
  const code = msg.headers?.get(ERROR_CODE_HEADER);
  const record = msg.headers?.get(RECORD_HEADER);
  const reply: OperationReply = { status: code ? Number(code) : 200, data: msg.data };
  if (record) reply.stored = { record, revision: Number(msg.headers!.get(REVISION_HEADER)) };
  return reply;
}

/** The success value of a reply; an error reply is thrown as the `ApiError` it carries. */
export function replyValue<T = unknown>(msg: ReplyMessage): T {
  const code = msg.headers?.get(ERROR_CODE_HEADER);
  if (code) throw new ApiError(Number(code), msg.json());
  return msg.json<T>();
}

/** The success of an operation that answers nothing: HTTP 204 with no body; `null` over NATS. */
export const NoContent = Type.Null({ description: "no body (HTTP 204); null over NATS" });

/** Whether `op` succeeds with no body (its success is `NoContent`). */
export const answersNoContent = (op: Operation): boolean => op.success.type === "null";

// Writing JSON responses and errors. Error bodies are the declared JSON only: never a
// stack or a cause; undeclared failures are logged here and answered as a bare 500.
import type { ServerResponse } from "node:http";
import { ApiError, InternalServerError, PayloadTooLarge, ServiceUnavailable } from "../schemas/index.ts";
import { log } from "../platform/index.ts";
import { answerThenDrain } from "./oversized.ts";

/**
 * A JSON answer, with an etag when it is a stored record. `headers`: names and values to send
 * before its own in the same `writeHead` (the array is taken, not copied).
 */
export function sendJson(
  res: ServerResponse,
  status: number,
  data: Uint8Array | string,
  revision?: number,
  headers: string[] = [],
): void {
  const length = typeof data === "string" ? Buffer.byteLength(data) : data.byteLength;
  headers.push("content-type", "application/json", "content-length", String(length));
  if (revision !== undefined) headers.push("etag", etagOf(revision));
  res.writeHead(status, headers);
  res.end(data);
}

/** A stored record's revision as an HTTP entity tag (`If-Match` names it back). */
export const etagOf = (revision: number): string => `"${revision}"`;

/** A success with no body (an operation whose success is `NoContent`). */
export function sendNoContent(res: ServerResponse): void {
  res.writeHead(204);
  res.end();
}

export function sendError(res: ServerResponse, err: unknown, context: { op?: string; requestId?: string } = {}): void {
  const failure = err instanceof ApiError ? err : internal(err, context);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (failure.status === ServiceUnavailable.status) res.setHeader("retry-after", "1");
  setRetryAfter(res, failure.body);
  // The client may still be sending an oversized body: answer, drain (bounded), then close.
  if (failure.status === PayloadTooLarge.status) {
    answerThenDrain(res, failure.status, JSON.stringify(failure.body));
    return;
  }
  sendJson(res, failure.status, JSON.stringify(failure.body));
}

function internal(err: unknown, context: { op?: string; requestId?: string }): ApiError {
  log.error({ ...context, err }, "undeclared failure");
  return InternalServerError.make({}, { cause: err });
}

/**
 * `Retry-After` from an error body's `retryAfterSeconds` (a refusal that names its wait, e.g.
 * TaskObjectBusy), given as the value or as an actor's reply bytes; nothing when it has none.
 */
export function setRetryAfter(res: ServerResponse, body: unknown): void {
  let value = body;
  if (body instanceof Uint8Array) {
    try {
      value = JSON.parse(Buffer.from(body).toString("utf8"));
    } catch {
      return; // not JSON: no header
    }
  }
  const seconds = (value as { retryAfterSeconds?: unknown } | null)?.retryAfterSeconds;
  if (typeof seconds === "number") res.setHeader("retry-after", String(seconds));
}

// Writing JSON responses and errors. Error bodies are the declared JSON only: never a
// stack or a cause; undeclared failures are logged here and answered as a bare 500.
import type { ServerResponse } from "node:http";
import { ApiError, InternalServerError, PayloadTooLarge, ServiceUnavailable } from "../schemas/index.ts";
import { log } from "../platform/index.ts";
import { answerThenDrain } from "./oversized.ts";

export function sendJson(res: ServerResponse, status: number, data: Uint8Array | string, revision?: number): void {
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": typeof data === "string" ? Buffer.byteLength(data) : data.byteLength,
    ...(revision === undefined ? {} : { etag: etagOf(revision) }),
  });
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
  // A refusal that names its wait (TaskObjectBusy) says it as HTTP does too.
  const retryAfter = (failure.body as { retryAfterSeconds?: unknown }).retryAfterSeconds;
  if (typeof retryAfter === "number") res.setHeader("retry-after", String(retryAfter));
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

/** `Retry-After` from an error body's `retryAfterSeconds` (an actor's 429), when it has one. */
export function setRetryAfter(res: ServerResponse, body: Uint8Array): void {
  try {
    const seconds = (JSON.parse(Buffer.from(body).toString("utf8")) as { retryAfterSeconds?: unknown })
      .retryAfterSeconds;
    if (typeof seconds === "number") res.setHeader("retry-after", String(seconds));
  } catch {
    // Not JSON: no header.
  }
}

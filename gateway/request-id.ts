// Request ids: the caller's `x-request-id` when it is a sane token, else a new uuid. The id
// is echoed on the response and sent to the actors, so one request can be followed in logs.
import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";

const SANE = /^[\w.:/+=-]{1,128}$/;
// Kept on the request itself: a WeakMap entry per request costs the collector more.
const ID = Symbol("requestId");
type Tagged = IncomingMessage & { [ID]?: string };

/** The request's id (decided once per request). */
export function requestId(req: IncomingMessage): string {
  let id = (req as Tagged)[ID];
  if (id === undefined) {
    const given = req.headers["x-request-id"];
    id = typeof given === "string" && SANE.test(given) ? given : randomUUID();
    (req as Tagged)[ID] = id;
  }
  return id;
}

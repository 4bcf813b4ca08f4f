// Request ids: the caller's `x-request-id` when it is a sane token, else a new uuid. The id
// is echoed on the response and sent to the actors, so one request can be followed in logs.
import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";

const SANE = /^[\w.:/+=-]{1,128}$/;
const ids = new WeakMap<IncomingMessage, string>();

/** The request's id (decided once per request). */
export function requestId(req: IncomingMessage): string {
  let id = ids.get(req);
  if (id === undefined) {
    const given = req.headers["x-request-id"];
    id = typeof given === "string" && SANE.test(given) ? given : randomUUID();
    ids.set(req, id);
  }
  return id;
}

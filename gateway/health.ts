// Liveness and readiness: `/livez` answers while the process serves HTTP; `/readyz` only
// while NATS is connected and the process is not shutting down.
import type { IncomingMessage, ServerResponse } from "node:http";
import { sendJson } from "./respond.ts";

export const LIVENESS_PATH = "/livez";
export const READINESS_PATH = "/readyz";

/** Answers the health paths (returns true when it did). */
export function answerHealth(req: IncomingMessage, res: ServerResponse, ready: () => boolean): boolean {
  if (req.method !== "GET" && req.method !== "HEAD") return false;
  const path = req.url?.split("?", 1)[0];
  if (path === LIVENESS_PATH) {
    sendJson(res, 200, '{"status":"live"}');
    return true;
  }
  if (path !== READINESS_PATH) return false;
  if (ready()) sendJson(res, 200, '{"status":"ready"}');
  else sendJson(res, 503, '{"_tag":"ServiceUnavailable"}');
  return true;
}

// CORS for the Task API host: allow-origin on every response, 204 for any preflight.
import type { IncomingMessage, ServerResponse } from "node:http";

/** Adds the CORS headers; answers `OPTIONS` itself (returns true when it did). */
export function applyCors(req: IncomingMessage, res: ServerResponse): boolean {
  res.setHeader("access-control-allow-origin", "*");
  res.setHeader("vary", "Origin");
  if (req.method !== "OPTIONS") return false;
  res.writeHead(204, {
    "access-control-allow-methods": "GET, POST, OPTIONS",
    "access-control-allow-headers": "Content-Type",
  });
  res.end();
  return true;
}

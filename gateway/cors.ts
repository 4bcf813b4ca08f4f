// CORS for the Task API host: allow-origin on every response, 204 for any preflight.
import type { IncomingMessage, ServerResponse } from "node:http";

/** Request headers a browser may send: the original's `Content-Type` plus the service's own. */
const ALLOWED_HEADERS = "Content-Type, Idempotency-Key, X-Request-Id";

const METHOD_ORDER = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/** The preflight's allowed methods: those of the API's operations, then OPTIONS. */
export function allowedMethods(methods: readonly string[]): string {
  return [...METHOD_ORDER.filter((m) => methods.includes(m)), "OPTIONS"].join(", ");
}

/**
 * Adds the CORS headers; answers `OPTIONS` itself (returns true when it did), allowing
 * `methods` (`allowedMethods`). A preflight never needs a key; `authorization` (API keys on)
 * lets a browser send one.
 */
export function applyCors(
  req: IncomingMessage,
  res: ServerResponse,
  { authorization = false, methods = "GET, POST, OPTIONS" } = {},
): boolean {
  corsHeaders(res);
  if (req.method !== "OPTIONS") return false;
  res.writeHead(204, {
    "access-control-allow-methods": methods,
    "access-control-allow-headers": authorization ? `${ALLOWED_HEADERS}, Authorization` : ALLOWED_HEADERS,
  });
  res.end();
  return true;
}

/** The headers every response of the Task API carries, errors included: names and values in turn. */
export const CORS_HEADERS: readonly string[] = ["access-control-allow-origin", "*", "vary", "Origin"];

/** Sets `CORS_HEADERS` on `res`. */
export function corsHeaders(res: ServerResponse): void {
  for (let i = 0; i < CORS_HEADERS.length; i += 2) res.setHeader(CORS_HEADERS[i]!, CORS_HEADERS[i + 1]!);
}

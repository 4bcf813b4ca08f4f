// Liveness, readiness and metrics: `/livez` answers while the process serves HTTP; `/readyz`
// only while NATS is connected and the process is not shutting down; `/metrics` for Prometheus.
import type { IncomingMessage, ServerResponse } from "node:http";
import { log, metricsText } from "../platform/index.ts";
import { InternalServerError, ServiceUnavailable } from "../schemas/index.ts";
import { sendJson } from "./respond.ts";

export const LIVENESS_PATH = "/livez";
export const READINESS_PATH = "/readyz";
export const METRICS_PATH = "/metrics";

const NOT_READY = JSON.stringify(
  ServiceUnavailable.make({ message: "not ready: NATS is not connected, or the process is shutting down" }).body,
);

/** Answers the health paths (returns true when it did). */
export function answerHealth(req: IncomingMessage, res: ServerResponse, ready: () => boolean): boolean {
  if (req.method !== "GET" && req.method !== "HEAD") return false;
  const path = req.url?.split("?", 1)[0];
  if (path === LIVENESS_PATH) {
    sendJson(res, 200, '{"status":"live"}');
    return true;
  }
  if (path === METRICS_PATH) {
    metricsText().then(
      ({ contentType, body }) => res.writeHead(200, { "content-type": contentType }).end(body),
      (err: unknown) => {
        log.error({ err }, "metrics failed");
        sendJson(res, 500, JSON.stringify(InternalServerError.make({}).body));
      },
    );
    return true;
  }
  if (path !== READINESS_PATH) return false;
  if (ready()) sendJson(res, 200, '{"status":"ready"}');
  else sendJson(res, 503, NOT_READY);
  return true;
}

/** A request listener with only the health and metrics paths (processes without an API). */
export function opsListener(ready: () => boolean) {
  return (req: IncomingMessage, res: ServerResponse) => {
    if (!answerHealth(req, res, ready)) sendJson(res, 404, '{"_tag":"RouteNotFound","message":"no such path"}');
  };
}

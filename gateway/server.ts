// One HTTP API: a node:http server with tight timeouts around the routes of its operations.
import { createServer, type Server } from "node:http";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import type { OpenApiInfo, Operation } from "../schemas/index.ts";
import { applyCors } from "./cors.ts";
import { docsResponder } from "./docs.ts";
import { answerHealth } from "./health.ts";
import { requestId } from "./request-id.ts";
import { buildRouter, type RouteOptions } from "./routes.ts";

export interface ApiServerOptions extends RouteOptions {
  operations: readonly Operation[];
  /** Add CORS headers and answer preflights (the Task API does). */
  cors?: boolean;
  /** Title and version of the API's OpenAPI document. */
  info: OpenApiInfo;
  /** Slow-client bounds: headers within, a whole request within, idle keep-alive for (ms). */
  timeouts?: { headersMs?: number; requestMs?: number; keepAliveMs?: number };
}

export interface ApiServer {
  readonly server: Server;
  /** Listens; resolves to the bound port (pass 0 for a free one). */
  listen(port: number, host?: string): Promise<number>;
  /**
   * Graceful stop: readiness turns off, new connections are refused, requests in flight
   * finish (their keep-alive sockets then close), idle sockets close at once.
   */
  close(): Promise<void>;
}

export function createApiServer(options: ApiServerOptions): ApiServer {
  const router = buildRouter(options.operations, options);
  const answerDocs = docsResponder(options.operations, options.info);
  let closing = false;
  const ready = () => !closing && options.nats.connected();
  const timeouts = { headersMs: 10_000, requestMs: 30_000, keepAliveMs: 5_000, ...options.timeouts };
  const server = createServer({
    keepAliveTimeout: timeouts.keepAliveMs,
    headersTimeout: timeouts.headersMs,
    requestTimeout: timeouts.requestMs,
    // Node enforces the two timeouts above only this often (30 s by default).
    connectionsCheckingInterval: Math.min(1_000, timeouts.headersMs / 2),
  }, (req, res) => {
    res.setHeader("x-request-id", requestId(req));
    if (options.cors && applyCors(req, res)) return;
    if (answerHealth(req, res, ready) || answerDocs(req, res)) return;
    if (closing) res.setHeader("connection", "close");
    // polka makes its own `next` when given none.
    void router.handler(req as never, res, undefined as never);
  });
  server.maxHeadersCount = 100;
  return {
    server,
    async listen(port, host = "0.0.0.0") {
      server.listen(port, host);
      await once(server, "listening");
      return (server.address() as AddressInfo).port;
    },
    async close() {
      closing = true;
      if (!server.listening) return;
      const closed = new Promise((resolve) => server.close(resolve));
      // Sockets of requests in flight turn idle when answered: close them as they do.
      const sweep = setInterval(() => server.closeIdleConnections(), 50);
      server.closeIdleConnections();
      await closed;
      clearInterval(sweep);
    },
  };
}

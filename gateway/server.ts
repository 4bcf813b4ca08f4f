// One HTTP API: a node:http server with tight timeouts around the routes of its operations.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { MisdirectedRequest, type OpenApiInfo, type Operation } from "../schemas/index.ts";
import { log, recordHttp } from "../platform/index.ts";
import { ANONYMOUS, setApiKey, unauthorized, type ApiKeys } from "./api-keys.ts";
import { answerClientError } from "./client-error.ts";
import { allowedMethods, applyCors, CORS_HEADERS, corsHeaders } from "./cors.ts";
import { docsResponder } from "./docs.ts";
import { answerHealth } from "./health.ts";
import { hostCheck } from "./host-check.ts";
import { requestId } from "./request-id.ts";
import type { AnsweredRead } from "./local-reads.ts";
import { sendError, sendJson } from "./respond.ts";
import { buildRouter, type RouteOptions } from "./routes.ts";

export interface ApiServerOptions extends RouteOptions {
  operations: readonly Operation[];
  /** Add CORS headers and answer preflights (the Task API does). */
  cors?: boolean;
  /** Title and version of the API's OpenAPI document. */
  info: OpenApiInfo;
  /** Slow-client bounds: headers within, a whole request within, idle keep-alive for (ms). */
  timeouts?: { headersMs?: number; requestMs?: number; keepAliveMs?: number };
  /** When given, every request but a preflight, health and docs needs a known bearer key (else 401). */
  apiKeys?: ApiKeys;
  /**
   * Names the `Host` header may carry (port aside) besides `localhost`, 127.0.0.1 and ::1,
   * which are always served; any other is 421 (DNS rebinding).
   */
  hostNames?: readonly string[];
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

const MISDIRECTED =
  "this API answers only the Host names localhost, 127.0.0.1, [::1] and those configured (API_HOSTNAMES): another " +
  "name may be a DNS-rebinding page";

export function createApiServer(options: ApiServerOptions): ApiServer {
  // Ends the answers that go on until the client closes (followed reads) when the server stops.
  const stopping = new AbortController();
  const router = buildRouter(options.operations, { ...options, stopping: stopping.signal });
  const api = options.operations[0]?.api ?? "";
  const servesHost = hostCheck(options.hostNames);
  const cors = {
    authorization: options.apiKeys !== undefined,
    methods: allowedMethods(options.operations.map((op) => op.http.method)),
  };
  const answerDocs = docsResponder(options.operations, options.info, { apiKeys: options.apiKeys !== undefined });
  let closing = false;
  const ready = () => !closing && options.nats.connected();
  const timeouts = { headersMs: 10_000, requestMs: 30_000, keepAliveMs: 5_000, ...options.timeouts };
  const server = createServer(
    {
      keepAliveTimeout: timeouts.keepAliveMs,
      headersTimeout: timeouts.headersMs,
      requestTimeout: timeouts.requestMs,
      // Node enforces the two timeouts above only this often (30 s by default).
      connectionsCheckingInterval: Math.min(1_000, timeouts.headersMs / 2),
    },
    (req, res) => {
      // First of all, preflights included: nothing is answered to a name this API does not serve.
      const served = servesHost(req.headers.host);
      // Who asks (undefined: no key or an unknown one); only health, docs and preflights go without.
      const key = options.apiKeys?.keyOf(req);
      const principal = options.apiKeys ? key?.principal : ANONYMOUS;
      // The common read first: a GET answered before is sent with all its headers in one call.
      // Only operations' URLs are kept, never those of the health or docs paths answered below.
      if (served && principal !== undefined && req.method === "GET") {
        const recalled = options.localReads?.recall(api, req.url!, principal);
        if (recalled) return answerRecalled(req, res, recalled, { cors: options.cors === true, closing });
      }
      res.setHeader("x-request-id", requestId(req));
      if (!served) {
        if (options.cors) corsHeaders(res);
        return sendError(res, MisdirectedRequest.make({ message: MISDIRECTED }));
      }
      if (options.cors && applyCors(req, res, cors)) return;
      if (answerHealth(req, res, ready) || answerDocs(req, res)) return;
      if (principal === undefined) {
        res.setHeader("www-authenticate", "Bearer");
        return sendError(res, unauthorized(req));
      }
      if (key) setApiKey(req, key);
      if (closing) res.setHeader("connection", "close");
      // polka makes its own `next` when given none.
      void router.handler(req as never, res, undefined as never);
    },
  );
  server.maxHeadersCount = 100;
  server.on("clientError", answerClientError);
  return {
    server,
    async listen(port, host = "0.0.0.0") {
      server.listen(port, host);
      await once(server, "listening");
      return (server.address() as AddressInfo).port;
    },
    async close() {
      closing = true;
      stopping.abort();
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

/**
 * A read found before at this URL, sent as it is (counted and logged like any answer), with the
 * headers every answer carries (corsHeaders, the request id) in the same `writeHead` call.
 */
function answerRecalled(
  req: IncomingMessage,
  res: ServerResponse,
  { op, body, revision }: AnsweredRead,
  { cors, closing }: { cors: boolean; closing: boolean },
): void {
  const started = performance.now();
  const id = requestId(req);
  const headers = cors ? ["x-request-id", id, ...CORS_HEADERS] : ["x-request-id", id];
  if (closing) headers.push("connection", "close");
  sendJson(res, 200, body, revision, headers);
  const seconds = (performance.now() - started) / 1000;
  recordHttp(op.api, op.name, 200, seconds);
  if (log.isLevelEnabled("debug"))
    log.debug({ requestId: id, op: op.name, status: 200, ms: seconds * 1000 }, "request");
}

// Forwards one request to an instance's real local port and streams both bodies; strips
// hop-by-hop and proxy headers; no answer within the timeout, or a refused connection, is 502.
import {
  request,
  type Agent,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type ServerResponse,
} from "node:http";
import { sendJson } from "./http-util.ts";
import { proxyAnswers, type BadGatewayReason } from "./proxy-answers.ts";

/** Where the proxy sends a request: a local TCP port, or a unix socket plus headers naming the port. */
export type Upstream =
  | { readonly host: string; readonly port: number }
  | { readonly socketPath: string; readonly headers: Readonly<Record<string, string>> };

export interface ForwardTarget {
  /** A local TCP port, or a unix socket (with headers naming the port inside the instance). */
  readonly upstream: Upstream;
  readonly agent: Agent;
  /** Longest wait for the app's response headers (a stopped process never answers). */
  readonly timeoutMs: number;
  /** Lower-case request header names never forwarded (the proxy's own). */
  readonly strip: ReadonlySet<string>;
  /** Headers added (overriding the caller's) on the way in. */
  readonly add: Readonly<Record<string, string>>;
}

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

class UpstreamTimeout extends Error {
  constructor() {
    super("upstream did not answer in time");
    this.name = "UpstreamTimeout";
  }
}

/**
 * Resolves when the exchange is over (answered, failed or abandoned by the caller). Bodies
 * flow with `.pipe()` and explicit teardown rather than `pipeline()`, which on Node 20 costs
 * an AbortController and an abort exception per call: a caller that goes away destroys the
 * upstream request, an upstream that breaks mid-answer destroys the response.
 */
export function forward(req: IncomingMessage, res: ServerResponse, target: ForwardTarget): Promise<void> {
  return new Promise((resolve) => {
    const to = target.upstream;
    const upstream = request({
      ...("socketPath" in to ? { socketPath: to.socketPath } : { host: to.host, port: to.port }),
      method: req.method,
      path: req.url,
      headers: {
        ...requestHeaders(req, target.strip),
        ...lowerCased(target.add),
        ...("headers" in to ? to.headers : {}),
      },
      agent: target.agent,
      setHost: false,
    });
    const timer = setTimeout(() => upstream.destroy(new UpstreamTimeout()), target.timeoutMs);
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve();
    };
    upstream.on("response", (answer) => {
      clearTimeout(timer);
      res.writeHead(answer.statusCode ?? 502, answer.statusMessage, responseHeaders(answer.headers));
      answer.on("error", () => res.destroy());
      // The app's socket closed before its body ended: the caller must not see a short answer as whole.
      answer.on("close", () => {
        if (!answer.complete) res.destroy();
      });
      answer.pipe(res);
    });
    upstream.on("error", (error) => {
      clearTimeout(timer);
      if (res.headersSent) res.destroy();
      else if (!res.destroyed) sendAnswer(res, badGatewayReason(error));
      settle();
    });
    res.on("error", () => upstream.destroy());
    res.on("close", () => {
      if (!res.writableFinished) upstream.destroy();
      settle();
    });
    // A request body that breaks off surfaces as the upstream's error above.
    req.on("error", () => upstream.destroy());
    req.on("close", () => {
      if (!req.complete) upstream.destroy();
    });
    req.pipe(upstream);
  });
}

function lowerCased(headers: Readonly<Record<string, string>>): Record<string, string> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
}

function sendAnswer(res: ServerResponse, reason: BadGatewayReason): void {
  const answer = proxyAnswers.badGateway(reason);
  sendJson(res, answer.status, answer.body);
}

function badGatewayReason(error: Error): BadGatewayReason {
  if (error instanceof UpstreamTimeout) return "timeout";
  const code = (error as NodeJS.ErrnoException).code;
  return code === "ECONNREFUSED" || code === "ENOENT" ? "no-listener" : "connection-failed";
}

function requestHeaders(req: IncomingMessage, strip: ReadonlySet<string>): OutgoingHttpHeaders {
  const headers = withoutHopByHop(req.headers, strip);
  const client = req.socket.remoteAddress;
  if (client) {
    const prior = req.headers["x-forwarded-for"];
    headers["x-forwarded-for"] = prior ? `${String(prior)}, ${client}` : client;
  }
  return headers;
}

function responseHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  return withoutHopByHop(headers, new Set());
}

function withoutHopByHop(headers: IncomingHttpHeaders, strip: ReadonlySet<string>): OutgoingHttpHeaders {
  const listed = new Set(
    String(headers.connection ?? "")
      .split(",")
      .map((token) => token.trim().toLowerCase())
      .filter(Boolean),
  );
  const result: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || listed.has(name) || strip.has(name)) continue;
    result[name] = value;
  }
  return result;
}

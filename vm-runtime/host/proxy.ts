// The host-side proxy of one instance (its `endpoint`): checks the X-aws-proxy-auth token,
// picks the port from X-aws-proxy-port, resumes a suspended instance once for all waiting
// requests when allowed, counts in-flight requests for the idle policy, then forwards.
import { Agent, createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { sendJson } from "../wire/http-util.ts";
import { forward } from "../wire/forward.ts";
import { proxyAnswers, type ProxyAnswer } from "../wire/proxy-answers.ts";
import { RUNTIME_PORT, type Upstream } from "./provider.ts";
import { INSTANCE_PORT_HEADER, INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";
import type { MicrovmState } from "../../schemas/index.ts";
import { PROXY_AUTH_HEADER, PROXY_PORT_HEADER } from "../wire/proxy-headers.ts";
import type { TokenClaims, TokenKey } from "../wire/token.ts";
import { createTokenVerifier, type RevokedCheck } from "./token-cache.ts";
import { SpanKind, traced } from "../../platform/index.ts";

/** The instance behind a proxy as the proxy sees it, asked on every request. */
export interface ProxiedInstance {
  readonly microvmId: string;
  /** Its current state. */
  state(): MicrovmState;
  /** Where a virtual port's requests go; undefined when the instance does not map it. */
  upstream(virtualPort: number): Upstream | undefined;
  /** Headers added to every forwarded request (the handle's `upstreamHeaders`). */
  upstreamHeaders?(): Readonly<Record<string, string>> | undefined;
  /** Whether a request may resume it while it is suspended (default: no). */
  autoResume?(): boolean;
  /** Resumes it; resolves once it is RUNNING. Called once for all the requests waiting. */
  resume?(): Promise<void>;
  /** A request started (after auth); `inFlight` counts it. */
  requestStarted?(inFlight: number): void;
  /** A request ended; `inFlight` no longer counts it. */
  requestEnded?(inFlight: number): void;
}

export interface InstanceProxyOptions {
  readonly instance: ProxiedInstance;
  readonly tokenKey: TokenKey;
  /** Longest wait for the app's response headers (default 30 s). */
  readonly upstreamTimeoutMs?: number;
  /** Clock for token expiry (default Date.now). */
  readonly now?: () => number;
  /** Whether a token's API key was revoked since it was issued (refused 403 `revoked`). */
  readonly revoked?: RevokedCheck;
}

export interface InstanceProxy {
  readonly server: Server;
  /** Listens (default 127.0.0.1, a free port); resolves with the endpoint `host:port`. */
  listen(port?: number, host?: string): Promise<string>;
  close(): Promise<void>;
  /** Requests past the auth check and not yet finished. */
  readonly inFlight: number;
  /** Epoch ms of the last authorised request start or end. */
  readonly lastActivityAt: number;
  /** Cuts the requests under way whose token is revoked now (`revoked`); returns how many. */
  endRevoked(): number;
}

/** Never forwarded: the proxy's own headers, and the instance headers only the proxy may set. */
const STRIPPED = new Set([
  PROXY_AUTH_HEADER.toLowerCase(),
  PROXY_PORT_HEADER.toLowerCase(),
  INSTANCE_SECRET_HEADER,
  INSTANCE_PORT_HEADER,
]);

export function createInstanceProxy(options: InstanceProxyOptions): InstanceProxy {
  const { instance } = options;
  const { microvmId } = instance;
  const agent = new Agent({ keepAlive: true, maxSockets: 256 });
  const now = options.now ?? Date.now;
  const tokens = createTokenVerifier(options.tokenKey, microvmId, {
    ...(options.revoked ? { revoked: options.revoked } : {}),
  });
  /** The requests under way, with their token's claims (a revocation cuts them). */
  const open = new Map<ServerResponse, TokenClaims>();
  let inFlight = 0;
  let lastActivityAt = now();
  let resuming: Promise<void> | undefined;

  /** One resume for every request that finds the instance suspended meanwhile. */
  const resumeOnce = () =>
    (resuming ??= Promise.resolve()
      .then(() => instance.resume?.() ?? Promise.reject(new Error("no resume configured")))
      .finally(() => {
        resuming = undefined;
      }));

  const track = (res: ServerResponse) => {
    inFlight += 1;
    lastActivityAt = now();
    notify(() => instance.requestStarted?.(inFlight));
    res.once("close", () => {
      inFlight -= 1;
      lastActivityAt = now();
      notify(() => instance.requestEnded?.(inFlight));
    });
  };

  /** Undefined once the instance runs (resumed first where allowed); else the proxy's answer. */
  async function runningOrRefusal(): Promise<ProxyAnswer | undefined> {
    const state = instance.state();
    if (state === "SUSPENDED" || state === "SUSPENDING") {
      if (!(instance.autoResume?.() ?? false)) return proxyAnswers.suspended(microvmId);
      return resumeOnce().then(
        () => undefined,
        () => proxyAnswers.resumeFailed(microvmId),
      );
    }
    if (state === "PENDING") return proxyAnswers.notReady(microvmId, state);
    return state === "RUNNING" ? undefined : proxyAnswers.gone(microvmId, state);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const portHeader = req.headers[PROXY_PORT_HEADER.toLowerCase()];
    const virtualPort = parsePort(portHeader);
    const token = req.headers[PROXY_AUTH_HEADER.toLowerCase()];
    const verdict = tokens.verify(typeof token === "string" ? token : undefined, virtualPort, now());
    if (!verdict.ok) {
      const asked = virtualPort === undefined ? undefined : { port: virtualPort, fromHeader: portHeader !== undefined };
      return answer(res, proxyAnswers.forbidden(verdict, asked));
    }
    if (virtualPort === undefined) return answer(res, proxyAnswers.invalidPort());
    // Only a token asked for with an API key can be revoked.
    if (options.revoked && verdict.claims.akid !== undefined) {
      open.set(res, verdict.claims);
      res.once("close", () => open.delete(res));
    }
    track(res);
    const refusal = await runningOrRefusal();
    if (refusal) return answer(res, refusal);
    const upstream = instance.upstream(virtualPort);
    if (upstream === undefined) return answer(res, proxyAnswers.badGateway("no-listener"));
    await forward(req, res, {
      upstream,
      agent,
      timeoutMs: options.upstreamTimeoutMs ?? 30_000,
      strip: STRIPPED,
      add: instance.upstreamHeaders?.() ?? {},
    });
  }

  const server = createServer((req, res) => {
    // A span per request when tracing is on: a child of the caller's `traceparent`, which goes
    // on to the instance as it came.
    traced(`proxy ${req.method}`, SpanKind.SERVER, req.headers, () => handle(req, res)).catch(() =>
      answer(res, proxyAnswers.badGateway("connection-failed")),
    );
  });

  return {
    server,
    get inFlight() {
      return inFlight;
    },
    get lastActivityAt() {
      return lastActivityAt;
    },
    endRevoked() {
      let ended = 0;
      for (const [res, claims] of open) {
        if (!options.revoked?.(claims)) continue;
        // A stream under way has no way to say why: its connection is cut.
        res.destroy();
        ended += 1;
      }
      return ended;
    },
    listen(port = 0, host = "127.0.0.1") {
      return new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => {
          server.off("error", reject);
          resolve(`${host}:${(server.address() as AddressInfo).port}`);
        });
      });
    },
    close() {
      return new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        agent.destroy();
      });
    },
  };
}

/** The virtual port a request names: the header, or 8080 when absent; undefined when invalid. */
function parsePort(header: string | string[] | undefined): number | undefined {
  if (header === undefined) return RUNTIME_PORT;
  if (typeof header !== "string" || !/^\d{1,5}$/.test(header.trim())) return undefined;
  const port = Number(header.trim());
  return port >= 1 && port <= 65_535 ? port : undefined;
}

/** A throwing activity hook must not take the proxy down (it runs in socket event handlers). */
function notify(hook: () => void): void {
  try {
    hook();
  } catch {
    // The lifecycle machine is gone or refused the event: activity accounting is best effort.
  }
}

function answer(res: ServerResponse, proxyAnswer: ProxyAnswer): void {
  sendJson(res, proxyAnswer.status, proxyAnswer.body, proxyAnswer.headers ?? {});
}

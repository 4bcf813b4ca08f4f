// The in-VM runtime server: routes `/__rpc__/` to the image's methods, `GET /__rpc__/` to the
// readiness probe, everything else to the image's fetch. Built here, listened to by the boot.
import { timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Image } from "./image.ts";
import { rawPath, sendJson } from "./http-util.ts";
import { createRpcHandler, type RpcHandler, type RuntimeLog } from "./rpc-handler.ts";
import { INSTANCE_SECRET_HEADER, RPC_HEALTH_PATH, RPC_PREFIX } from "./rpc-wire.ts";
import { sendWebResponse, toWebRequest } from "./fetch-bridge.ts";

export interface RuntimeOptions {
  /** Largest RPC body accepted (default 1 MiB); larger answers 413. */
  readonly bodyLimitBytes?: number;
  /** Where failures answered as 500 are reported (default: stderr). */
  readonly log?: RuntimeLog;
  /** When set, every request must carry it in `x-instance-secret` (else 403). */
  readonly accessSecret?: string;
}

export const DEFAULT_RPC_BODY_LIMIT = 1024 * 1024;

/** The body of the readiness probe. */
export const HEALTH_BODY = { _tag: "~alchemy/rpc/health", status: "ok" } as const;

const defaultLog: RuntimeLog = (message, cause) => {
  const detail = cause instanceof Error ? `${cause.name}: ${cause.message}` : cause === undefined ? "" : String(cause);
  process.stderr.write(`[microvm-runtime] ${message}${detail ? `: ${detail}` : ""}\n`);
};

/** Creates (does not listen) the runtime's HTTP server for an image. */
export function createRuntimeServer(image: Image, options: RuntimeOptions = {}): Server {
  const log = options.log ?? defaultLog;
  const rpc = createRpcHandler(image, { bodyLimitBytes: options.bodyLimitBytes ?? DEFAULT_RPC_BODY_LIMIT, log });
  const admitted = secretCheck(options.accessSecret);
  // Validators are compiled once the host's readiness probe has been answered, while it
  // records the instance as RUNNING: neither the boot nor (usually) the first call waits.
  let prepared = false;
  const prepareAfter = (res: ServerResponse) => {
    if (prepared) return;
    prepared = true;
    res.once("finish", () => setImmediate(() => void rpc.prepare()));
  };
  const server = createServer((req, res) => {
    if (!admitted(req)) return sendJson(res, 403, { _tag: "Forbidden", message: "requests must come through the proxy" });
    route(req, res, image, rpc, log, prepareAfter).catch((error: unknown) => {
      log("request failed", error);
      sendJson(res, 500, { _tag: "InternalServerError" });
    });
  });
  // Long keep-alive so a proxy's pooled connections are not closed under it mid-reuse.
  server.keepAliveTimeout = 65_000;
  return server;
}

/** Admits every request without a secret; with one, only requests carrying it. */
function secretCheck(secret: string | undefined): (req: IncomingMessage) => boolean {
  if (!secret) return () => true;
  const expected = Buffer.from(secret);
  return (req) => {
    const given = req.headers[INSTANCE_SECRET_HEADER];
    if (typeof given !== "string") return false;
    const candidate = Buffer.from(given);
    return candidate.length === expected.length && timingSafeEqual(candidate, expected);
  };
}

async function route(
  req: IncomingMessage,
  res: ServerResponse,
  image: Image,
  rpc: RpcHandler,
  log: RuntimeLog,
  onHealthProbe: (res: ServerResponse) => void,
) {
  const path = rawPath(req.url);
  if (path === undefined) return sendJson(res, 400, { _tag: "BadRequest", message: "unusable request target" });
  if (path === RPC_HEALTH_PATH && (req.method === "GET" || req.method === "HEAD")) {
    onHealthProbe(res);
    return sendJson(res, 200, HEALTH_BODY, { "cache-control": "no-store" });
  }
  if (path.startsWith(RPC_PREFIX)) return rpc(req, res, path.slice(RPC_PREFIX.length));
  await serveFetch(req, res, image, log);
}

async function serveFetch(req: IncomingMessage, res: ServerResponse, image: Image, log: RuntimeLog) {
  const abort = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  let request: Request;
  try {
    request = toWebRequest(req, abort.signal);
  } catch {
    return sendJson(res, 400, { _tag: "BadRequest", message: "unusable request target" });
  }
  let response: Response;
  try {
    response = await image.fetch(request);
    if (!(response instanceof Response)) throw new TypeError("fetch handler did not return a Response");
  } catch (error) {
    log("fetch handler failed", error);
    return sendJson(res, 500, { _tag: "InternalServerError" });
  }
  await sendWebResponse(req, res, response);
}

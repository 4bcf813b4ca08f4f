// The in-VM runtime server: routes `/__rpc__/` to the image's methods, `GET /__rpc__/` to the
// readiness probe, everything else to the image's fetch. Built here, listened to by the boot.
// An object image (`defineObject`) is served in object mode (object-mode.ts, loaded for it alone).
import { timingSafeEqual } from "node:crypto";
import { Agent, createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { argumentsSchema, type Image } from "../image.ts";
import { isObjectImage } from "../object.ts";
import { ALARM_PATH } from "../objects/channel.ts";
import type { ObjectMode } from "./object-mode.ts";
import { rawPath, sendJson } from "../wire/http-util.ts";
import { createRpcHandler, type RpcHandler, type RuntimeLog } from "./rpc-handler.ts";
import { forward } from "../wire/forward.ts";
import { INSTANCE_PORT_HEADER, INSTANCE_SECRET_HEADER, RPC_HEALTH_PATH, RPC_PREFIX } from "../wire/rpc.ts";
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

/** The body of the readiness probe (plus `methods`, what the image declares). */
export const HEALTH_BODY = { _tag: "~alchemy/rpc/health", status: "ok" } as const;

/** One declared method as the readiness probe lists it (how a host learns an image's shape). */
export interface MethodDescription {
  readonly name: string;
  readonly args?: unknown;
}

/** The image's methods: names and argument schemas, JSON-safe. */
export function describeMethods(image: Image): MethodDescription[] {
  return Object.keys(image.methods).map((name) => {
    const args = argumentsSchema(image.methods[name]!);
    return args === undefined ? { name } : { name, args: JSON.parse(JSON.stringify(args)) as unknown };
  });
}

const defaultLog: RuntimeLog = (message, cause) => {
  const detail = cause instanceof Error ? `${cause.name}: ${cause.message}` : cause === undefined ? "" : String(cause);
  process.stderr.write(`[microvm-runtime] ${message}${detail ? `: ${detail}` : ""}\n`);
};

/** Creates (does not listen) the runtime's HTTP server for an image. */
export function createRuntimeServer(image: Image, options: RuntimeOptions = {}): Server {
  const log = options.log ?? defaultLog;
  const objectMode = isObjectImage(image)
    ? import("./object-mode.ts").then(({ createObjectMode }) => createObjectMode(image))
    : undefined;
  const rpc = createRpcHandler(image, {
    bodyLimitBytes: options.bodyLimitBytes ?? DEFAULT_RPC_BODY_LIMIT,
    log,
    ...(objectMode ? { invoke: async (definition, args) => (await objectMode).invoke(definition, args) } : {}),
  });
  const admitted = secretCheck(options.accessSecret);
  // Validators are compiled once the host's readiness probe has been answered, while it
  // records the instance as RUNNING: neither the boot nor (usually) the first call waits.
  let prepared = false;
  const prepareAfter = (res: ServerResponse) => {
    if (prepared) return;
    prepared = true;
    res.once("finish", () => setImmediate(() => void rpc.prepare()));
  };
  const health = {
    ...HEALTH_BODY,
    methods: describeMethods(image),
    ...(isObjectImage(image) ? { object: image.object } : {}),
  };
  const portAgent = new Agent({ keepAlive: true });
  const server = createServer((req, res) => {
    if (!admitted(req))
      return sendJson(res, 403, { _tag: "Forbidden", message: "requests must come through the proxy" });
    const port = req.headers[INSTANCE_PORT_HEADER];
    if (port !== undefined) return void forwardToPort(req, res, port, portAgent);
    route(req, res, image, rpc, log, health, prepareAfter, objectMode).catch((error: unknown) => {
      log("request failed", error);
      sendJson(res, 500, { _tag: "InternalServerError", message: "the instance's runtime failed (its log has why)" });
    });
  });
  // Long keep-alive so a proxy's pooled connections are not closed under it mid-reuse.
  server.keepAliveTimeout = 65_000;
  if (objectMode) serveObjectChannel(server, objectMode, admitted);
  return server;
}

/**
 * The object channel arrives as an Upgrade (only an object image's server takes one). An
 * upgraded socket is no longer one of the server's connections: closing them all (shutdown, a
 * checkpoint) closes the channel too.
 */
function serveObjectChannel(server: Server, mode: Promise<ObjectMode>, admitted: (req: IncomingMessage) => boolean) {
  let loaded: ObjectMode | undefined;
  void mode.then((m) => (loaded = m));
  server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    void mode.then((m) => m.acceptChannel(req, socket, head, admitted(req)));
  });
  const closeAll = server.closeAllConnections.bind(server);
  server.closeAllConnections = () => {
    closeAll();
    loaded?.close();
  };
}

/**
 * A request the proxy sent for another of the instance's ports (it reaches the instance only
 * through this runtime's socket): forwarded to that port on the instance's own loopback.
 */
function forwardToPort(
  req: IncomingMessage,
  res: ServerResponse,
  header: string | string[],
  agent: Agent,
): Promise<void> {
  const port = typeof header === "string" && /^\d{1,5}$/.test(header) ? Number(header) : 0;
  if (port < 1 || port > 65_535) {
    sendJson(res, 400, { _tag: "BadRequest", message: "invalid instance port" });
    return Promise.resolve();
  }
  return forward(req, res, {
    upstream: { host: "127.0.0.1", port },
    agent,
    timeoutMs: 30_000,
    strip: new Set([INSTANCE_SECRET_HEADER, INSTANCE_PORT_HEADER]),
    add: {},
  });
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
  health: object,
  onHealthProbe: (res: ServerResponse) => void,
  objectMode: Promise<ObjectMode> | undefined,
) {
  const path = rawPath(req.url);
  if (path === undefined) return sendJson(res, 400, { _tag: "BadRequest", message: "unusable request target" });
  if (path === RPC_HEALTH_PATH && (req.method === "GET" || req.method === "HEAD")) {
    onHealthProbe(res);
    return sendJson(res, 200, health, { "cache-control": "no-store" });
  }
  if (path.startsWith(RPC_PREFIX)) return rpc(req, res, path.slice(RPC_PREFIX.length));
  if (objectMode && path === ALARM_PATH) return (await objectMode).serveAlarm(req, res);
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
    return sendJson(res, 500, {
      _tag: "InternalServerError",
      message: "the image's fetch handler failed (the instance's log has why)",
    });
  }
  await sendWebResponse(req, res, response);
}

// The session a host holds with one running activation: reads the object's traits from the
// runtime's readiness probe, opens the object channel (serving storage and alarm requests,
// channel-host.ts) and relays calls and alarms to the runtime as the RPC wire carries them.
import { Agent, request, type IncomingMessage, type OutgoingHttpHeaders } from "node:http";
import type { Socket } from "node:net";
import { log as platformLog } from "../../platform/index.ts";
import type { Upstream } from "../wire/forward.ts";
import { errorEnvelope, RPC_HEALTH_PATH, rpcPath } from "../wire/rpc.ts";
import type { ObjectAlarms } from "./alarms.ts";
import { ALARM_PATH, CHANNEL_PATH, CHANNEL_PROTOCOL, OBJECT_NAME_HEADER } from "./channel.ts";
import { serveChannel, type SessionLog } from "./channel-host.ts";
import { ObjectError } from "./errors.ts";
import type { ObjectRef } from "./keys.ts";
import type { ObjectStorage } from "./storage.ts";
import type { ObjectAnswer, ObjectTraits } from "./types.ts";

export interface SessionLimits {
  /** Storage and alarm requests served at once (default 32); more are answered with ObjectChannelBusy. */
  readonly inFlight?: number;
  /** Longest request line from the runtime (default 320 KiB); a longer one closes the channel. */
  readonly requestLineBytes?: number;
  /** Largest answer of a call or alarm read (default 8 MiB); a larger one is a 502 ObjectAnswerTooLarge. */
  readonly answerBytes?: number;
  /** Longest wait for the readiness probe and the channel's Upgrade answer (default 10 s). */
  readonly openTimeoutMs?: number;
}

export interface ObjectSessionOptions {
  /** The runtime's upstream (`upstreamOf(handle, RUNTIME_PORT)` or the provider's `upstream()`). */
  readonly upstream: Upstream;
  /** The handle's `upstreamHeaders` (the instance's secret). */
  readonly headers?: Readonly<Record<string, string>>;
  readonly object: ObjectRef;
  /** The activation's fenced storage (`objectStores(...).open(object, fence)`). */
  readonly storage: ObjectStorage;
  readonly alarms: ObjectAlarms;
  /** Called once, when a write of the activation is refused as ActivationSuperseded. */
  readonly onSuperseded?: (err: ObjectError) => void;
  readonly limits?: SessionLimits;
  /** Where failures the instance is told only as "unavailable", and channels closed for garbage, are reported (default: the host's log). */
  readonly log?: SessionLog;
}

export interface ObjectSession {
  readonly traits: ObjectTraits;
  /** Calls `method` with `args`; rejects only when the runtime cannot be reached or `signal` aborts. */
  call(method: string, args: readonly unknown[], signal?: AbortSignal): Promise<ObjectAnswer>;
  /** Runs the object's alarm handler (404 when it has none). */
  alarm(signal?: AbortSignal): Promise<ObjectAnswer>;
  /** Resolves once the channel closed (the instance ended it, or died, or `close()`). */
  readonly closed: Promise<void>;
  /** Closes the channel and the session's connections. */
  close(): void;
}

const DEFAULT_ANSWER_BYTES = 8 * 1024 * 1024;
const DEFAULT_OPEN_TIMEOUT_MS = 10_000;
/** Largest readiness answer read (it lists the methods and their schemas). */
const PROBE_ANSWER_BYTES = 1024 * 1024;

/** The traits of an object image from its readiness probe's body; undefined for another image. */
export function objectTraitsOf(healthBody: unknown): ObjectTraits | undefined {
  const object = (healthBody as { object?: unknown } | null)?.object;
  if (typeof object !== "object" || object === null) return undefined;
  const { idleSeconds, hibernate, alarm } = object as Record<string, unknown>;
  if (!Number.isInteger(idleSeconds) || (idleSeconds as number) < 1) return undefined;
  if (hibernate !== "none" && hibernate !== "snapshot") return undefined;
  if (typeof alarm !== "boolean") return undefined;
  return { idleSeconds: idleSeconds as number, hibernate, alarm };
}

/** Opens the session; rejects with NotAnObject for an image that is not an object, else with why it could not. */
export async function openObjectSession(options: ObjectSessionOptions): Promise<ObjectSession> {
  const limits = options.limits ?? {};
  const openTimeout = limits.openTimeoutMs ?? DEFAULT_OPEN_TIMEOUT_MS;
  const answerBytes = limits.answerBytes ?? DEFAULT_ANSWER_BYTES;
  const log = options.log ?? hostLog(options.object);
  const agent = new Agent({ keepAlive: true });
  const target = targetOf(options.upstream, options.headers);
  try {
    const traits = await probeTraits(target, agent, options.object, openTimeout);
    const { socket, head } = await upgrade(target, options.object.name, openTimeout);
    const closed = serveChannel(socket, head, {
      object: options.object,
      storage: options.storage,
      alarms: options.alarms,
      log,
      ...(options.onSuperseded ? { onSuperseded: options.onSuperseded } : {}),
      ...(limits.inFlight ? { inFlight: limits.inFlight } : {}),
      ...(limits.requestLineBytes ? { lineBytes: limits.requestLineBytes } : {}),
    });
    return {
      traits,
      call: (method, args, signal) =>
        exchange(target, agent, "POST", rpcPath(method), JSON.stringify(args), answerBytes, signal),
      alarm: (signal) => exchange(target, agent, "POST", ALARM_PATH, "", answerBytes, signal),
      closed,
      close() {
        socket.destroy();
        agent.destroy();
      },
    };
  } catch (err) {
    agent.destroy();
    throw err;
  }
}

/** The object's traits from the runtime's readiness answer; NotAnObject when it declares none. */
async function probeTraits(target: Target, agent: Agent, object: ObjectRef, timeoutMs: number): Promise<ObjectTraits> {
  const probe = await exchange(
    target,
    agent,
    "GET",
    RPC_HEALTH_PATH,
    undefined,
    PROBE_ANSWER_BYTES,
    timeout(timeoutMs),
  );
  const traits = probe.status === 200 ? objectTraitsOf(parseJson(probe.body)) : undefined;
  if (!traits)
    throw new ObjectError("NotAnObject", 400, `the image of ${object.image} is not an object (use defineObject)`);
  return traits;
}

/** The host's log, naming the object (never what its code stored). */
const hostLog =
  (object: ObjectRef): SessionLog =>
  (message, err) =>
    platformLog.warn({ principal: object.principal, image: object.image, object: object.name, err }, message);

interface Target {
  readonly address: { socketPath: string } | { host: string; port: number };
  readonly headers: Readonly<Record<string, string>>;
}

function targetOf(upstream: Upstream, headers: Readonly<Record<string, string>> = {}): Target {
  if ("socketPath" in upstream)
    return { address: { socketPath: upstream.socketPath }, headers: { ...headers, ...upstream.headers } };
  return { address: { host: upstream.host, port: upstream.port }, headers };
}

const timeout = (ms: number) => AbortSignal.timeout(ms);

function parseJson(body: Uint8Array): unknown {
  try {
    return JSON.parse(Buffer.from(body).toString("utf8"));
  } catch {
    return undefined;
  }
}

/** One request to the runtime, its answer read up to `maxBytes` (past them: a 502 envelope). */
function exchange(
  target: Target,
  agent: Agent,
  method: string,
  path: string,
  body: string | undefined,
  maxBytes: number,
  signal: AbortSignal | undefined,
): Promise<ObjectAnswer> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const headers: OutgoingHttpHeaders = { ...target.headers };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      headers["content-length"] = Buffer.byteLength(body);
    }
    const req = request({ ...target.address, method, path, headers, agent }, (res) =>
      readAnswer(res, maxBytes).then(resolve, reject),
    );
    const onAbort = () => req.destroy(signal?.reason instanceof Error ? signal.reason : new Error("aborted"));
    signal?.addEventListener("abort", onAbort, { once: true });
    req.once("close", () => signal?.removeEventListener("abort", onAbort));
    req.on("error", reject);
    req.end(body);
  });
}

function readAnswer(res: IncomingMessage, maxBytes: number): Promise<ObjectAnswer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    res.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes <= maxBytes) return void chunks.push(chunk);
      res.destroy();
      resolve(tooLarge(maxBytes));
    });
    res.once("end", () => resolve({ status: res.statusCode ?? 502, body: Buffer.concat(chunks) }));
    res.on("error", reject);
    res.once("close", () => {
      if (!res.complete) reject(new Error("the object's runtime closed its answer before it ended"));
    });
  });
}

function tooLarge(maxBytes: number): ObjectAnswer {
  const envelope = errorEnvelope({
    _tag: "ObjectAnswerTooLarge",
    message: `the object's answer is over ${maxBytes} bytes`,
  });
  return { status: 502, body: Buffer.from(JSON.stringify(envelope)) };
}

/** Opens the object channel: an Upgrade on the runtime's socket, naming the object. */
function upgrade(target: Target, name: string, timeoutMs: number): Promise<{ socket: Socket; head: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = request({
      ...target.address,
      method: "GET",
      path: CHANNEL_PATH,
      agent: false,
      headers: {
        ...target.headers,
        connection: "Upgrade",
        upgrade: CHANNEL_PROTOCOL,
        [OBJECT_NAME_HEADER]: encodeURIComponent(name),
      },
    });
    // A timer, not a signal: a request's signal would still reach the socket once it is the channel's.
    const timer = setTimeout(
      () => req.destroy(new Error("the object's runtime did not open its channel in time")),
      timeoutMs,
    );
    req.once("upgrade", (_res, socket: Socket, head: Buffer) => {
      clearTimeout(timer);
      resolve({ socket, head });
    });
    req.once("response", (res) => {
      clearTimeout(timer);
      res.resume();
      reject(new Error(`the object's runtime refused its channel (${res.statusCode})`));
    });
    req.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    req.end();
  });
}

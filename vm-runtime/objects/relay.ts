// The relay between microVM hosts, both of its sides: a host that receives a call for an object
// whose lease another host holds sends it on to that host's own subject
// (`microvms.host.<host-token>.objects`), which runs it only if it holds the object (else it
// answers "moved", and the sender reads the lease again). Answers carry the object's status and
// body as they are; a declared failure (ObjectBusy, NotAnObject, …) travels as its error body.
import { headers as natsHeaders, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import { performance } from "node:perf_hooks";
import { parseLease } from "../../placement/index.ts";
import { isNoResponders, isTimeout, log, type VersionedStore } from "../../platform/index.ts";
import {
  ApiError,
  GatewayTimeout,
  InternalServerError,
  ownerSubjectRoot,
  ServiceUnavailable,
  withPrefix,
} from "../../schemas/index.ts";
import type { ObjectRef } from "./keys.ts";
import type { ObjectAnswer } from "./types.ts";

/** What one host asks another to do with an object it holds. */
export type RelayRequest =
  | { readonly op: "call"; readonly object: ObjectRef; readonly method: string; readonly args: unknown[] }
  | { readonly op: "alarm"; readonly object: ObjectRef }
  | { readonly op: "deactivate"; readonly object: ObjectRef }
  /** Deletes the object where it lives (answered 204). */
  | { readonly op: "delete"; readonly object: ObjectRef }
  /** Answered 200 `true` when the object is active at the host asked. */
  | { readonly op: "active"; readonly object: ObjectRef };

/** A request that runs the object's code: a method, or its alarm. */
export type CallRequest = Extract<RelayRequest, { op: "call" | "alarm" }>;

/** A request its object's holder runs in the object's mailbox: a call, or a delete. */
export type HolderRequest = Extract<RelayRequest, { op: "call" | "alarm" | "delete" }>;

/** The holder does not hold the object (any more): read its lease again. */
export const MOVED = "moved";
/** Nobody takes the holder's subject: the host is gone (its lease lapses, then another takes it). */
export const GONE = "gone";
/** The holder stopped renewing its lease while the request waited: it is paused or cut off. */
export const SILENT = "silent";

const REPLY_HEADER = "Object-Reply";
const STATUS_HEADER = "Object-Status";

/**
 * `relay`, given up once the holder has not renewed the object's lease (key `leaseKey`) for its
 * TTL plus `marginMs` while the answer is awaited: a paused or cut-off holder never answers, and
 * once its lease may be taken its writes are refused (fenced), so the request may run elsewhere.
 */
export async function relayWatched(
  nc: NatsConnection,
  prefix: string,
  hostId: string,
  request: RelayRequest,
  timeoutMs: number,
  watch: { leases: VersionedStore; leaseKey: string; marginMs: number },
): Promise<ObjectAnswer | typeof MOVED | typeof GONE | typeof SILENT> {
  const relayed = relay(nc, prefix, hostId, request, timeoutMs);
  relayed.catch(() => undefined);
  const done = new AbortController();
  try {
    return await Promise.race([relayed, silence(watch.leases, watch.leaseKey, hostId, watch.marginMs, done.signal)]);
  } finally {
    done.abort();
  }
}

/** Resolves SILENT once `owner`'s lease of `key` has not moved for its TTL plus `marginMs`; never after `stop`. */
async function silence(
  leases: VersionedStore,
  key: string,
  owner: string,
  marginMs: number,
  stop: AbortSignal,
): Promise<typeof SILENT> {
  let revision = -1;
  let since = performance.now();
  for (;;) {
    const entry = await leases.get(key).catch(() => undefined);
    const lease = entry?.value ? parseLease(entry.value) : undefined;
    const ttlMs = lease?.ttlMs ?? 2_000;
    if (entry && entry.revision !== revision) {
      revision = entry.revision;
      since = performance.now();
    } else if (lease?.owner === owner && performance.now() - since > ttlMs + marginMs) {
      return SILENT;
    }
    // Never resolves once stopped: the race it is in is over.
    await sleep(Math.max(50, ttlMs / 3), undefined, { signal: stop }).catch(() => new Promise<never>(() => undefined));
  }
}

/** The subject on which host `hostId` takes the relayed requests of the objects it holds. */
export const relaySubject = (prefix: string, hostId: string): string =>
  withPrefix(prefix, `${ownerSubjectRoot("microvms", "byHost", hostId)}.objects`);

/**
 * Sends `request` to `hostId`: the object's answer, `MOVED`, or `GONE` when no host takes its
 * subject; a declared failure is thrown as its `ApiError`. No answer in `timeoutMs` → 504
 * GatewayTimeout (the outcome is unknown), the connection lost → 503 ServiceUnavailable.
 */
export async function relay(
  nc: NatsConnection,
  prefix: string,
  hostId: string,
  request: RelayRequest,
  timeoutMs: number,
): Promise<ObjectAnswer | typeof MOVED | typeof GONE> {
  let msg: Msg;
  try {
    msg = await nc.request(relaySubject(prefix, hostId), JSON.stringify(request), { timeout: timeoutMs });
  } catch (err) {
    if (isNoResponders(err)) return GONE;
    if (isTimeout(err)) throw GatewayTimeout.make({}, { cause: err });
    throw ServiceUnavailable.make({}, { cause: err });
  }
  const kind = msg.headers?.get(REPLY_HEADER);
  const status = Number(msg.headers?.get(STATUS_HEADER));
  if (kind === MOVED) return MOVED;
  if (kind === "answer") return { status, body: msg.data };
  const body = JSON.parse(Buffer.from(msg.data).toString("utf8")) as ConstructorParameters<typeof ApiError>[1];
  throw new ApiError(status || 500, body);
}

/**
 * Serves the requests other hosts relay to `hostId`: `handle` answers one (MOVED when this host
 * does not hold the object). A failure other than an `ApiError` is logged and answered 500.
 */
export function serveRelay(
  nc: NatsConnection,
  prefix: string,
  hostId: string,
  handle: (request: RelayRequest) => Promise<ObjectAnswer | typeof MOVED>,
): Subscription {
  return nc.subscribe(relaySubject(prefix, hostId), {
    callback: (_err, msg) => {
      void answer(msg, handle);
    },
  });
}

async function answer(msg: Msg, handle: (request: RelayRequest) => Promise<ObjectAnswer | typeof MOVED>) {
  const h = natsHeaders();
  try {
    const result = await handle(JSON.parse(msg.string()) as RelayRequest);
    if (result === MOVED) {
      h.set(REPLY_HEADER, MOVED);
      msg.respond(new Uint8Array(), { headers: h });
      return;
    }
    h.set(REPLY_HEADER, "answer");
    h.set(STATUS_HEADER, String(result.status));
    msg.respond(result.body, { headers: h });
  } catch (err) {
    const failure = err instanceof ApiError ? err : InternalServerError.make({});
    if (!(err instanceof ApiError)) log.error({ err }, "a relayed object request failed");
    h.set(REPLY_HEADER, "error");
    h.set(STATUS_HEADER, String(failure.status));
    msg.respond(JSON.stringify(failure.body), { headers: h });
  }
}

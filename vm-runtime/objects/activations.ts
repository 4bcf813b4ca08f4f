// The objects of the cluster as one microVM host runs them: each object has at most one
// activation, at the host holding its lease in the objects bucket (placement, lease key
// `objectKey`); a call reaching another host is relayed to the holder (relay.ts), or, when the
// lease is free or its holder gone past the lease's bound, this host claims it. Calls to one
// object run one at a time in arrival order (the activation's mailbox), at most `maxPending`
// waiting; storage writes carry the lease as their fence. An activation ends when idle for its
// image's `idleSeconds`, when a call outlives its timeout, when its instance ends, when it is
// superseded, and when the host stops: its instance stopped, its lease released, storage kept.
import { performance } from "node:perf_hooks";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { LeaseLost, leaseOwner, Placement, type Activation } from "../../placement/index.ts";
import { log, OBJECTS_BUCKET, versionedStore, type Requester, type VersionedStore } from "../../platform/index.ts";
import { ApiError, ImageNotFound, NotAnObject, ObjectBusy, ServiceUnavailable } from "../../schemas/index.ts";
import { RPC_ERROR_TAG } from "../wire/rpc.ts";
import { objectAlarms, type ObjectAlarms } from "./alarms.ts";
import { activationFence } from "./fence.ts";
import { objectKey, objectOfKey, type ObjectRef } from "./keys.ts";
import { launchObject, type LaunchDeps, type RunningObject } from "./launch.ts";
import { GONE, MOVED, relay, relayWatched, serveRelay, SILENT, type RelayRequest } from "./relay.ts";
import { objectStores, type ObjectStores } from "./storage.ts";
import type { ObjectActivations, ObjectAnswer } from "./types.ts";

/** Calls one object may have waiting or running; one more is refused with 429 ObjectBusy. */
export const DEFAULT_MAX_PENDING_CALLS = 64;
/** The longest one call may run in its object's code before the activation is stopped. */
export const DEFAULT_CALL_TIMEOUT_MS = 30_000;
/** Time for an activation's instance to start and its session to open. */
export const DEFAULT_START_TIMEOUT_MS = 30_000;
/** Objects active on one host at once; past it the least recently called idle one is evicted. */
export const DEFAULT_MAX_ACTIVE = 50;

export interface ObjectActivationsOptions extends Omit<LaunchDeps, "startTimeoutMs"> {
  readonly nc: NatsConnection;
  /** Carries lease, storage and alarm writes. */
  readonly requester: Requester;
  /** Subject prefix (empty for none). */
  readonly prefix: string;
  /** This host: the owner its leases name, and its relay subject. */
  readonly hostId: string;
  readonly stores?: ObjectStores;
  readonly alarms?: ObjectAlarms;
  readonly maxPending?: number;
  /** Objects active here at once (default 50): each holds an instance. */
  readonly maxActive?: number;
  readonly callTimeoutMs?: number;
  readonly startTimeoutMs?: number;
  /** A silent holder's lease is taken over this long (plus a margin) after its last renewal (default 3 s). */
  readonly leaseTtlMs?: number;
  /** Time for a relayed request's answer, its wait in the holder's mailbox included (default 65 s). */
  readonly relayTimeoutMs?: number;
}

/** The activations of one host, with what the host itself uses of them. */
export interface HostObjectActivations extends ObjectActivations {
  /** Runs the due alarm of the object `key` names (`startAlarmFiring`'s handler); throws to retry it. */
  fireAlarm(key: string): Promise<void>;
  /** Objects active on this host now. */
  activeHere(): ObjectRef[];
}

/** An activation running here: its lease, its instance, and its idle timer. */
interface Held {
  readonly activation: Activation;
  readonly run: RunningObject;
  idle?: NodeJS.Timeout;
  /** When its last call ended (monotonic ms). */
  lastUsed: number;
  retired?: Promise<void>;
}

/** The refusal of a call to the object of lease key `key` while `pending` calls wait. */
const objectBusy = (key: string, pending: number) => {
  const object = objectOfKey(key);
  return ObjectBusy.make({
    image: object?.image ?? "",
    name: object?.name ?? "",
    retryAfterSeconds: BUSY_RETRY_SECONDS,
    message: `the object has ${pending} calls waiting, its most: try again in ${BUSY_RETRY_SECONDS} s`,
  });
};

/**
 * A call past its timeout, answered as the RPC wire answers a thrown error (504): the object's
 * code did not answer, so the outcome of what it did is unknown; its activation was stopped.
 */
const callTimedOut = (ms: number): ObjectAnswer =>
  answerJson(504, {
    _tag: RPC_ERROR_TAG,
    error: {
      _tag: "ObjectCallTimeout",
      message: `the object did not answer within ${ms / 1000} s: its activation was stopped (the next call starts it again)`,
    },
  });

const BUSY_RETRY_SECONDS = 1;
// Placement's own idle release is not used: each object's image says its idle time.
const NEVER_IDLE_MS = 2 ** 31 - 1;
const ROUTE_RECHECK_MS = 200;
// Placement's margin (its default): a lease unmoved for its TTL plus this may be taken over.
const TAKEOVER_MARGIN_MS = 500;
const NO_CONTENT: ObjectAnswer = { status: 204, body: new Uint8Array() };

export function startObjectActivations(options: ObjectActivationsOptions): HostObjectActivations {
  const { nc, prefix, hostId } = options;
  const stores = options.stores ?? objectStores(options.requester);
  const alarms = options.alarms ?? objectAlarms(options.requester);
  const callTimeoutMs = options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
  const maxActive = options.maxActive ?? DEFAULT_MAX_ACTIVE;
  const ttlMs = options.leaseTtlMs ?? 3_000;
  const relayTimeoutMs = options.relayTimeoutMs ?? 65_000;
  // Long enough for a gone holder's lease to lapse and be claimed here.
  const routeBudgetMs = 3 * ttlMs + 2_000;
  const launchDeps: LaunchDeps = {
    images: options.images,
    provider: options.provider,
    openSession: options.openSession,
    startTimeoutMs: options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS,
  };
  const leases: VersionedStore = versionedStore(options.requester, OBJECTS_BUCKET);
  const held = new Map<string, Held>();
  let closing = false;

  const placement = new Placement({
    ownerId: hostId,
    leases,
    ttlMs,
    idleMs: NEVER_IDLE_MS,
    maxPending: options.maxPending ?? DEFAULT_MAX_PENDING_CALLS,
    // The name placement gives is the lease key (an object key).
    busy: (key, pending) => objectBusy(key, pending),
    // A lease lost or lapsed (the host was cut off): its instance stops at once.
    onActivation: (event) => {
      const here = held.get(event.key);
      if (event.event === "end" && here?.activation.claimRevision === event.revision) void retire(here, event.reason);
    },
  });

  /**
   * Stops the activation's instance, once, and releases its lease (storage stays) unless
   * `release` is false: then the activation's next call starts a new instance.
   */
  function retire(h: Held, reason: string | undefined, release = true): Promise<void> {
    h.retired ??= (async () => {
      if (held.get(h.activation.key) === h) held.delete(h.activation.key);
      clearTimeout(h.idle);
      log.info({ object: h.activation.key, reason }, "object deactivated");
      await h.run.stop();
    })();
    if (!release) return h.retired;
    return h.retired.then(() =>
      placement.release(h.activation).catch((err: unknown) => log.warn({ err }, "object lease release failed")),
    );
  }

  /** Releases `activation`'s lease after the calls queued for it, unless one of them started an instance. */
  function releaseUnlessUsed(activation: Activation): void {
    placement
      .run(activation, async () => {
        if (held.get(activation.key)?.activation !== activation) await placement.release(activation);
      })
      .catch((err: unknown) => {
        if (!(err instanceof LeaseLost) && !(err instanceof ApiError)) log.warn({ err }, "object lease release failed");
      });
  }

  /**
   * Room for one more instance: at the most active objects, the least recently called one with
   * no call waiting is evicted; none idle → 503 (the caller retries, or another host serves).
   */
  async function makeRoom(): Promise<void> {
    if (held.size < maxActive) return;
    let oldest: Held | undefined;
    for (const h of held.values())
      if (h.activation.pending === 0 && (!oldest || h.lastUsed < oldest.lastUsed)) oldest = h;
    if (!oldest)
      throw ServiceUnavailable.make({
        message: `this host runs its most objects (${maxActive}), each with a call under way: retry`,
      });
    await retire(oldest, "evicted to make room");
  }

  /** Starts the object's instance for `activation` (in its mailbox); a failure releases the lease. */
  async function activate(activation: Activation, object: ObjectRef): Promise<Held> {
    await makeRoom().catch(async (err: unknown) => {
      await placement.release(activation).catch(() => undefined);
      throw err;
    });
    const storage = stores.open(object, activationFence(placement, activation));
    let h: Held | undefined;
    let run: RunningObject;
    try {
      run = await launchObject(launchDeps, object, storage, alarms, (err) => {
        log.warn({ object: activation.key, err }, "object activation superseded");
        if (h) void retire(h, "superseded");
      });
    } catch (err) {
      await placement.release(activation).catch(() => undefined);
      throw err;
    }
    h = { activation, run, lastUsed: performance.now() };
    if (activation.ended) {
      await retire(h, "lease lost while starting");
      throw new LeaseLost(activation.name);
    }
    held.set(activation.key, h);
    const current = h;
    // Ended by itself (not stopped here): the lease goes too.
    void run.ended.then(() => (current.retired ? undefined : retire(current, "instance ended")));
    return h;
  }

  function armIdle(h: Held): void {
    const timer = setTimeout(() => {
      // In the mailbox: a call that came meanwhile re-armed the timer, and this one gives way.
      placement
        .run(h.activation, async () => {
          if (h.idle === timer) await retire(h, "idle");
        })
        .catch((err: unknown) => {
          if (!(err instanceof LeaseLost) && !(err instanceof ApiError)) log.warn({ err }, "object eviction failed");
        });
    }, h.run.session.traits.idleSeconds * 1000).unref();
    h.idle = timer;
  }

  /** Runs `request` in `activation` (in its mailbox), starting its instance first if none runs. */
  async function runHere(activation: Activation, request: CallRequest, signal?: AbortSignal): Promise<ObjectAnswer> {
    signal?.throwIfAborted();
    let h = held.get(activation.key);
    if (h && h.activation !== activation) await retire(h, "lease renewed by a new activation");
    if (!h || h.activation !== activation || h.retired) h = await activate(activation, request.object);
    clearTimeout(h.idle);
    h.idle = undefined;
    try {
      return await bounded(h, request);
    } finally {
      h.lastUsed = performance.now();
      if (held.get(activation.key) === h) armIdle(h);
    }
  }

  /** The call in the object's code, within the call timeout: past it the activation is stopped. */
  async function bounded(h: Held, request: CallRequest): Promise<ObjectAnswer> {
    const session = h.run.session;
    if (request.op === "alarm" && !session.traits.alarm) return NO_CONTENT;
    const timeout = AbortSignal.timeout(callTimeoutMs);
    const answer = request.op === "call" ? session.call(request.method, request.args, timeout) : session.alarm(timeout);
    // The session's own abort, and this, should it not heed its signal.
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), callTimeoutMs);
    });
    try {
      const settled = await Promise.race([answer, late]);
      if (settled !== "late") return settled;
    } catch (err) {
      if (!timeout.aborted) throw err;
    } finally {
      clearTimeout(timer);
      answer.catch(() => undefined);
    }
    // The answer is given in this activation (its lease kept until the calls queued behind it ran).
    await retire(h, "call timed out", false);
    releaseUnlessUsed(h.activation);
    return callTimedOut(callTimeoutMs);
  }

  /** Runs `request` where the object lives: here (claiming it if free), or at its holder. */
  async function atHolder(request: CallRequest, signal?: AbortSignal): Promise<ObjectAnswer> {
    const key = objectKey(request.object);
    let deadline = performance.now() + routeBudgetMs;
    let suspect: string | undefined;
    for (;;) {
      if (closing) throw ServiceUnavailable.make({});
      const route = await placement.route(key, suspect);
      if (route.kind === "local") {
        try {
          return await placement.run(route.activation, (activation) => runHere(activation, request, signal));
        } catch (err) {
          if (!(err instanceof LeaseLost)) throw err;
        }
      } else if (route.kind === "remote") {
        const answer = await relayWatched(nc, prefix, route.owner, request, relayTimeoutMs, {
          leases,
          leaseKey: key,
          marginMs: TAKEOVER_MARGIN_MS,
        });
        if (answer === GONE || answer === SILENT) {
          // Its lease lapses (or has): claimed here once it may be, within a budget from now.
          suspect = route.owner;
          deadline = Math.max(deadline, performance.now() + routeBudgetMs);
        } else if (answer !== MOVED) return answer;
        else {
          placement.forget(key);
          suspect = undefined;
        }
      } else {
        const pause = Math.min(route.until, deadline, performance.now() + ROUTE_RECHECK_MS) - performance.now();
        if (pause > 0) await new Promise((r) => setTimeout(r, pause));
      }
      if (performance.now() >= deadline) throw ServiceUnavailable.make({});
    }
  }

  /** A request another host relayed here: run only if this host holds the object (else MOVED). */
  async function relayed(request: RelayRequest): Promise<ObjectAnswer | typeof MOVED> {
    const key = objectKey(request.object);
    if (request.op === "active") return answerJson(200, held.has(key));
    if (request.op === "deactivate") {
      await deactivateHere(key);
      return NO_CONTENT;
    }
    if (closing) return MOVED;
    const route = await placement.route(key);
    if (route.kind !== "local") return MOVED;
    try {
      return await placement.run(route.activation, (activation) => runHere(activation, request));
    } catch (err) {
      if (err instanceof LeaseLost) return MOVED;
      throw err;
    }
  }

  /** Ends the object's activation here, after the calls queued before. */
  async function deactivateHere(key: string): Promise<boolean> {
    const h = held.get(key);
    if (!h) return false;
    await placement
      .run(h.activation, () => retire(h, "deactivated"), {})
      .catch((err: unknown) => {
        if (!(err instanceof LeaseLost)) throw err;
      });
    return true;
  }

  const subscription: Subscription = serveRelay(nc, prefix, hostId, relayed);

  return {
    call: (object, method, args, signal) => atHolder({ op: "call", object, method, args }, signal),

    async deactivate(object) {
      const key = objectKey(object);
      if (await deactivateHere(key)) return;
      const owner = leaseOwner((await leases.get(key)).value);
      // A gone holder's instance went with it; its lease lapses by itself.
      if (owner && owner !== hostId) await relay(nc, prefix, owner, { op: "deactivate", object }, relayTimeoutMs);
    },

    async activeOn(object) {
      const key = objectKey(object);
      if (held.has(key)) return hostId;
      const owner = leaseOwner((await leases.get(key)).value);
      if (!owner || owner === hostId) return undefined;
      const answer = await relay(nc, prefix, owner, { op: "active", object }, 2_000).catch(() => undefined);
      return typeof answer === "object" && Buffer.from(answer.body).toString("utf8") === "true" ? owner : undefined;
    },

    async fireAlarm(key) {
      const object = objectOfKey(key);
      if (!object) {
        log.warn({ key }, "an alarm names no object: dropped");
        return;
      }
      try {
        const answer = await atHolder({ op: "alarm", object });
        if (answer.status < 200 || answer.status >= 300)
          throw new Error(`the object's alarm handler failed (status ${answer.status})`);
      } catch (err) {
        // The image went, or never was an object: no attempt will run this alarm.
        if (err instanceof ApiError && (err._tag === ImageNotFound.tag || err._tag === NotAnObject.tag)) {
          log.warn({ object: key, reason: err._tag }, "an object's alarm cannot run: dropped");
          return;
        }
        throw err;
      }
    },

    activeHere: () => [...held.values()].map((h) => h.run.object),

    async close() {
      closing = true;
      await subscription.drain().catch(() => undefined);
      await Promise.allSettled(
        [...held.values()].map((h) => placement.run(h.activation, () => retire(h, "host stopping"))),
      );
      await placement.close(0);
    },
  };
}

type CallRequest = Extract<RelayRequest, { op: "call" | "alarm" }>;

function answerJson(status: number, value: unknown): ObjectAnswer {
  return { status, body: new TextEncoder().encode(JSON.stringify(value)) };
}

// The activations this host runs: each with its lease (placement's `Activation`), its instance
// and session, and its idle timer. A call runs in its activation's mailbox, starting the
// instance first if none runs; past its timeout the instance is stopped. An activation is
// retired (instance stopped, lease released, storage kept) when idle for its image's
// `idleSeconds` or to make room for another (evicted: an object with `hibernate: "snapshot"`
// is checkpointed into its snapshot instead of stopped), when its instance ends, when it is
// superseded or its lease lapses, when it is deactivated, and when the host stops.
import { performance } from "node:perf_hooks";
import { LeaseLost, type Activation, type ActivationEvent, type Placement } from "../../placement/index.ts";
import { log } from "../../platform/index.ts";
import { ApiError, ServiceUnavailable } from "../../schemas/index.ts";
import { RPC_ERROR_TAG } from "../wire/rpc.ts";
import type { ObjectAlarms } from "./alarms.ts";
import { activationFence } from "./fence.ts";
import type { ObjectRef } from "./keys.ts";
import { launchObject, type LaunchDeps, type RunningObject } from "./launch.ts";
import type { CallRequest } from "./relay.ts";
import type { ObjectStores } from "./storage.ts";
import type { ObjectAnswer } from "./types.ts";

export interface HeldObjectsDeps {
  readonly placement: Placement;
  readonly launch: LaunchDeps;
  readonly stores: ObjectStores;
  readonly alarms: ObjectAlarms;
  readonly callTimeoutMs: number;
  /** Objects active here at once. */
  readonly maxActive: number;
}

/** The activations running on this host. */
export interface HeldObjects {
  /** Runs `request` in `activation` (call it in the activation's mailbox: `placement.run`). */
  run(activation: Activation, request: CallRequest, signal?: AbortSignal): Promise<ObjectAnswer>;
  /** Placement's `onActivation`: an activation that ended (lease lost or lapsed) stops its instance. */
  ended(event: ActivationEvent): void;
  /** Ends the activation of lease key `key` here, after the calls queued before; false when none runs here. */
  deactivate(key: string, reason: string): Promise<boolean>;
  has(key: string): boolean;
  objects(): ObjectRef[];
  /** Retires every activation, each after the calls queued for it. */
  stopAll(): Promise<void>;
}

const NO_CONTENT: ObjectAnswer = { status: 204, body: new Uint8Array() };

/** An activation running here: its lease, its instance, and its idle timer. */
interface Held {
  readonly activation: Activation;
  readonly run: RunningObject;
  idle?: NodeJS.Timeout;
  /** When its last call ended (monotonic ms). */
  lastUsed: number;
  retired?: Promise<void>;
}

export function heldObjects(deps: HeldObjectsDeps): HeldObjects {
  const { placement, stores, alarms, callTimeoutMs, maxActive } = deps;
  const held = new Map<string, Held>();

  /**
   * Stops the activation's instance, once, and releases its lease (storage stays) unless
   * `release` is false: then the activation's next call starts a new instance. An eviction
   * (`evicted`) hibernates an object with `hibernate: "snapshot"`: its snapshot is stored
   * before its lease is released.
   */
  function retire(h: Held, reason: string | undefined, release = true, evicted = false): Promise<void> {
    h.retired ??= (async () => {
      if (held.get(h.activation.key) === h) held.delete(h.activation.key);
      h.activation.pinned = false;
      clearTimeout(h.idle);
      log.info({ object: h.activation.key, reason }, "object deactivated");
      await h.run.stop({ hibernate: evicted });
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
    // In its mailbox: a call that comes meanwhile waits for its snapshot, not a fresh start.
    const evicted = oldest;
    const evict = () => retire(evicted, "evicted to make room", true, true);
    await placement.run(evicted.activation, evict).catch(evict);
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
      run = await launchObject(deps.launch, object, storage, alarms, (err) => {
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
    activation.pinned = true;
    await run.established();
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
          if (h.idle === timer) await retire(h, "idle", true, true);
        })
        .catch((err: unknown) => {
          if (!(err instanceof LeaseLost) && !(err instanceof ApiError)) log.warn({ err }, "object eviction failed");
        });
    }, h.run.session.traits.idleSeconds * 1000).unref();
    h.idle = timer;
  }

  /** Runs `request` in `activation` (in its mailbox), starting its instance first if none runs. */
  async function run(activation: Activation, request: CallRequest, signal?: AbortSignal): Promise<ObjectAnswer> {
    signal?.throwIfAborted();
    let h = held.get(activation.key);
    if (h && h.activation !== activation) await retire(h, "lease renewed by a new activation");
    if (!h || h.activation !== activation || h.retired) h = await activate(activation, request.object);
    clearTimeout(h.idle);
    h.idle = undefined;
    try {
      return await bounded(h, request);
    } catch (err) {
      // Its lease lapsed or was taken under it (its writes were refused): where the object is now runs it.
      if (!activation.live) throw new LeaseLost(activation.name, { cause: err });
      throw err;
    } finally {
      h.lastUsed = performance.now();
      if (held.get(activation.key) === h) armIdle(h);
    }
  }

  /** The call in the object's code, within the call timeout: past it the activation is stopped. */
  async function bounded(h: Held, request: CallRequest): Promise<ObjectAnswer> {
    const session = h.run.session;
    if (request.op === "alarm" && !session.traits.alarm) return NO_CONTENT;
    // One timer per call: it aborts the session's exchange, and answers should the session not heed that.
    const timeout = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => {
        timeout.abort(new DOMException("the call timed out", "TimeoutError"));
        resolve("late");
      }, callTimeoutMs);
    });
    const answer =
      request.op === "call"
        ? session.call(request.method, request.args, timeout.signal)
        : session.alarm(timeout.signal);
    try {
      const settled = await Promise.race([answer, late]);
      if (settled !== "late") return settled;
    } catch (err) {
      if (!timeout.signal.aborted) throw err;
    } finally {
      clearTimeout(timer);
      answer.catch(() => undefined);
    }
    // The answer is given in this activation (its lease kept until the calls queued behind it ran).
    await retire(h, "call timed out", false);
    releaseUnlessUsed(h.activation);
    return callTimedOut(callTimeoutMs);
  }

  /** Ends the object's activation here, after the calls queued before. */
  async function deactivate(key: string, reason: string): Promise<boolean> {
    const h = held.get(key);
    if (!h) return false;
    await placement
      .run(h.activation, () => retire(h, reason), {})
      .catch((err: unknown) => {
        if (!(err instanceof LeaseLost)) throw err;
      });
    return true;
  }

  return {
    run,
    ended(event) {
      const here = held.get(event.key);
      if (event.event === "end" && here?.activation.claimRevision === event.revision) void retire(here, event.reason);
    },
    deactivate,
    has: (key) => held.has(key),
    objects: () => [...held.values()].map((h) => h.run.object),
    async stopAll() {
      await Promise.allSettled(
        [...held.values()].map((h) => placement.run(h.activation, () => retire(h, "host stopping"))),
      );
    },
  };
}

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

/** An answer with `value` as its JSON body. */
export function answerJson(status: number, value: unknown): ObjectAnswer {
  return { status, body: new TextEncoder().encode(JSON.stringify(value)) };
}

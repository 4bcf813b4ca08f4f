// The activations this host runs: each with its lease (placement's `Activation`), its instance
// and session, and its idle timer. A call runs in its activation's mailbox, starting the
// instance first if none runs; past its timeout the instance is stopped. An activation is
// retired (instance stopped, lease released, storage kept) when idle for its image's
// `idleSeconds`, to make room for another (room.ts) or when the host stops (in these three an
// object with `hibernate: "snapshot"` is checkpointed into its snapshot instead of stopped),
// when its instance ends, when it is superseded or its lease lapses, and when it is deactivated.
// An activation lists its object when its instance starts; a delete runs in the mailbox too (no
// call interleaves).
import { performance } from "node:perf_hooks";
import { LeaseLost, type Activation, type ActivationEvent, type Placement } from "../../placement/index.ts";
import { log } from "../../platform/index.ts";
import { ApiError } from "../../schemas/index.ts";
import { RPC_ERROR_TAG } from "../wire/rpc.ts";
import type { ObjectAlarms } from "./alarms.ts";
import { eraseObject } from "./deletion.ts";
import type { ObjectDirectory } from "./directory.ts";
import { activationFence } from "./fence.ts";
import type { ObjectRef } from "./keys.ts";
import { launchObject, type LaunchDeps, type RunningObject } from "./launch.ts";
import type { CallRequest } from "./relay.ts";
import { activationRoom, type Occupant } from "./room.ts";
import type { ObjectStores } from "./storage.ts";
import type { ObjectAnswer } from "./types.ts";

export interface HeldObjectsDeps {
  readonly placement: Placement;
  readonly launch: LaunchDeps;
  readonly stores: ObjectStores;
  readonly alarms: ObjectAlarms;
  /** Lists each object whose activation starts here. */
  readonly directory: ObjectDirectory;
  readonly callTimeoutMs: number;
  /** Objects active here at once. */
  readonly maxActive: number;
  /** Objects of one principal active here at once. */
  readonly maxActivePerPrincipal: number;
  /** The longest a hibernation at the host's stop may take before the instance is stopped instead. */
  readonly stopHibernateMs: number;
}

/** The activations running on this host. */
export interface HeldObjects {
  /** Runs `request` in `activation` (call it in the activation's mailbox: `placement.run`). */
  run(activation: Activation, request: CallRequest, signal?: AbortSignal): Promise<ObjectAnswer>;
  /**
   * Deletes the object of `activation` (in its mailbox): stops its instance, if one runs, and
   * removes its state; the calls queued behind start it afresh. Starts no instance.
   */
  remove(activation: Activation, object: ObjectRef): Promise<ObjectAnswer>;
  /** Placement's `onActivation`: an activation that ended (lease lost or lapsed) stops its instance. */
  ended(event: ActivationEvent): void;
  /** Ends the activation of lease key `key` here, after the calls queued before; false when none runs here. */
  deactivate(key: string, reason: string): Promise<boolean>;
  has(key: string): boolean;
  objects(): ObjectRef[];
  /**
   * Retires every activation, each after the calls queued for it: those with `hibernate:
   * "snapshot"` hibernate, within `stopHibernateMs` each, and every lease is released.
   */
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
  /** Chosen for eviction (to make room): no other start picks it. */
  evicting?: boolean;
  retired?: Promise<void>;
}

export function heldObjects(deps: HeldObjectsDeps): HeldObjects {
  const { placement, stores, alarms, callTimeoutMs } = deps;
  const held = new Map<string, Held>();
  // Counts the activations starting (not yet in `held`) and weighs those held.
  const room = activationRoom<Occupant & { readonly h: Held }>(deps);

  /**
   * Stops the activation's instance, once, and releases its lease (storage stays) unless
   * `release` is false: then the activation's next call starts a new instance. An eviction
   * (`evicted`) hibernates an object with `hibernate: "snapshot"`: its snapshot is stored
   * before its lease is released.
   */
  function retire(
    h: Held,
    reason: string | undefined,
    release = true,
    evicted = false,
    hibernateWithin?: number,
  ): Promise<void> {
    h.retired ??= (async () => {
      if (held.get(h.activation.key) === h) held.delete(h.activation.key);
      h.activation.pinned = false;
      clearTimeout(h.idle);
      log.info({ object: h.activation.key, reason }, "object deactivated");
      const within = hibernateWithin === undefined ? {} : { signal: AbortSignal.timeout(hibernateWithin) };
      await h.run.stop({ hibernate: evicted, ...within });
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
   * Room for one more instance of `principal`'s (room.ts), taken until the returned release is
   * called (once the activation is held, or failed), after evicting what it takes.
   */
  async function makeRoom(principal: string): Promise<() => void> {
    for (;;) {
      const running = [...held.values()].map((h) => ({
        h,
        principal: h.run.object.principal,
        idle: h.activation.pending === 0,
        lastUsed: h.lastUsed,
        evicting: h.evicting === true,
      }));
      const evicted = room.toEvict(principal, running)?.h;
      if (!evicted) return room.reserve(principal);
      evicted.evicting = true;
      // In its mailbox: a call that comes meanwhile waits for its snapshot, not a fresh start.
      const evict = () => retire(evicted, "evicted to make room", true, true);
      await placement.run(evicted.activation, evict).catch(evict);
    }
  }

  /** Starts the object's instance for `activation` (in its mailbox); a failure releases the lease. */
  async function activate(activation: Activation, object: ObjectRef): Promise<Held> {
    const taken = await makeRoom(object.principal).catch(async (err: unknown) => {
      await placement.release(activation).catch(() => undefined);
      throw err;
    });
    try {
      return await started(activation, object, taken);
    } finally {
      taken();
    }
  }

  /** The object's instance started and held for `activation` (its room `admitted` given back as `held` counts it). */
  async function started(activation: Activation, object: ObjectRef, admitted: () => void): Promise<Held> {
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
    // An object now (its image is one): listed before its code runs, so what it stores is seen.
    try {
      await deps.directory.enter(object);
    } catch (err) {
      await retire(h, "not listed");
      throw err;
    }
    admitted();
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

  async function remove(activation: Activation, object: ObjectRef): Promise<ObjectAnswer> {
    const h = held.get(activation.key);
    // Its memory goes with it: no hibernation.
    if (h) await retire(h, "deleted", false);
    const { hibernation, output } = deps.launch;
    const remains = { ...deps, ...(hibernation ? { hibernation } : {}), ...(output ? { output } : {}) };
    await eraseObject(remains, object, () => placement.fence(activation));
    releaseUnlessUsed(activation);
    return NO_CONTENT;
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
    remove,
    ended(event) {
      const here = held.get(event.key);
      if (event.event === "end" && here?.activation.claimRevision === event.revision) void retire(here, event.reason);
    },
    deactivate,
    has: (key) => held.has(key),
    objects: () => [...held.values()].map((h) => h.run.object),
    async stopAll() {
      // Each hibernates holding its lease (renewed meanwhile), then releases it: another host
      // takes the object over at once, from its snapshot.
      await Promise.allSettled(
        [...held.values()].map((h) =>
          placement.run(h.activation, () => retire(h, "host stopping", true, true, deps.stopHibernateMs)),
        ),
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

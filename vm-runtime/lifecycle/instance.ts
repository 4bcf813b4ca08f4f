// One managed instance: the lifecycle machine wired to a provider (its I/O) and to its proxy
// (activity drives the idle policy; a request to a suspended instance resumes it once).
// This is what a microVM actor holds per instance; persistence stays with the caller.
import { createActor, fromPromise, waitFor } from "xstate";
import { lifecycleMachine } from "./machine.ts";
import { canAccept, microvmState, type LifecycleActor, type LifecycleSnapshot } from "./snapshot.ts";
import { remainingMs, type LifecycleEvent, type LifecycleTimeouts, type SavedSnapshot } from "./types.ts";
import { createInstanceProxy, type InstanceProxy } from "../host/proxy.ts";
import type { RevokedCheck } from "../host/token-cache.ts";
import { upstreamOf, type MicrovmHandle, type MicrovmProvider } from "../host/provider.ts";
import type { IdlePolicy, MicrovmState } from "../../schemas/index.ts";
import type { TokenKey } from "../wire/token.ts";
import { StateReason } from "../wire/state-reasons.ts";

export interface MicrovmInstanceOptions {
  readonly microvmId: string;
  /** Path of the image module the provider starts. */
  readonly image: string;
  readonly imageIdentifier?: string;
  readonly idlePolicy: IdlePolicy;
  readonly provider: MicrovmProvider;
  readonly tokenKey: TokenKey;
  /** Whether a token's API key was revoked since it was issued (the proxy refuses it). */
  readonly tokenRevoked?: RevokedCheck;
  readonly memoryMiB?: number;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** Where the proxy listens (default 127.0.0.1, a free port) and how long it waits for the app. */
  readonly proxy?: { readonly host?: string; readonly port?: number; readonly upstreamTimeoutMs?: number };
  /** Called after every transition (e.g. to persist `actor.getPersistedSnapshot()`). */
  readonly onSnapshot?: (snapshot: LifecycleSnapshot) => void;
  /** Where suspend keeps a snapshot instead of freezing (providers that checkpoint). */
  readonly snapshots?: InstanceSnapshots;
  /**
   * A persisted lifecycle snapshot to go on from instead of starting (an instance another run
   * of a host suspended into a stored snapshot): SUSPENDED, restored on RESUME.
   */
  readonly persisted?: unknown;
}

/**
 * Suspend that survives the host: the instance checkpointed into a stored snapshot, and
 * restored from it. The caller supplies where it is stored (owner, instance) and how.
 */
export interface InstanceSnapshots {
  /**
   * Checkpoints the instance (it ends) and stores its snapshot; resolves with what the record
   * keeps. Calls `progress` as the work moves on (the step's deadline counts from the last call).
   */
  save(handle: MicrovmHandle, progress?: () => void): Promise<SavedSnapshot>;
  /** Restores the instance from its stored snapshot; resolves with its new handle once it answers. */
  restore(saved: SavedSnapshot, signal: AbortSignal, progress?: () => void): Promise<MicrovmHandle>;
}

export interface MicrovmInstance {
  readonly microvmId: string;
  /** `host:port` of the instance's proxy. */
  readonly endpoint: string;
  readonly actor: LifecycleActor;
  readonly proxy: InstanceProxy;
  state(): MicrovmState;
  /** Sends an operation's event; false (answer 409) when the current state does not take it. */
  send(event: LifecycleEvent): boolean;
  /** Resolves with the state once it is one of `states`; rejects after `timeoutMs`. */
  waitForState(states: readonly MicrovmState[], timeoutMs?: number): Promise<MicrovmState>;
  /** Terminates (if not already, unless `terminate` is false) and closes the proxy. */
  close(options?: { readonly terminate?: boolean }): Promise<void>;
}

/** Starts the proxy and the machine; the instance is PENDING until the runtime answers. */
export async function launchMicrovmInstance(options: MicrovmInstanceOptions): Promise<MicrovmInstance> {
  const { provider } = options;
  const machine = lifecycleMachine.provide({
    actors: {
      start: fromPromise(({ input, signal }) =>
        provider.start({ microvmId: input.microvmId, image: options.image, ...memory(options.memoryMiB) }, signal),
      ),
      suspend: fromPromise(({ input }) => provider.suspend(input.handle)),
      resume: fromPromise(({ input }) => provider.resume(input.handle)),
      terminate: fromPromise(async ({ input }) => {
        if (input.handle) await provider.terminate(input.handle, input.graceMs);
      }),
      checkpoint: fromPromise(({ input }) => requireSnapshots(options.snapshots).save(input.handle, progressed)),
      restore: fromPromise(({ input, signal }) =>
        requireSnapshots(options.snapshots).restore(input.saved, signal, progressed),
      ),
    },
  });
  const actor = createActor(machine, {
    ...(options.persisted === undefined ? {} : { snapshot: options.persisted as LifecycleSnapshot }),
    input: {
      microvmId: options.microvmId,
      idlePolicy: options.idlePolicy,
      ...(options.imageIdentifier === undefined ? {} : { imageIdentifier: options.imageIdentifier }),
      ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
      checkpoints: options.snapshots !== undefined,
    },
  });
  /** A snapshot step moved on: its deadline counts from now. */
  function progressed() {
    actor.send({ type: "SNAPSHOT_PROGRESS" });
  }
  const state = () => microvmState(actor.getSnapshot());
  const waitForState = async (states: readonly MicrovmState[], timeoutMs = 30_000) =>
    microvmState(await waitFor(actor, (snapshot) => states.includes(microvmState(snapshot)), { timeout: timeoutMs }));

  const proxy = createInstanceProxy({
    instance: {
      microvmId: options.microvmId,
      state,
      upstream: (port) => {
        const handle: MicrovmHandle | undefined = actor.getSnapshot().context.handle;
        if (!handle) return undefined;
        return provider.upstream ? provider.upstream(handle, port) : upstreamOf(handle, port);
      },
      upstreamHeaders: () => actor.getSnapshot().context.handle?.upstreamHeaders,
      autoResume: () => options.idlePolicy.autoResumeEnabled,
      resume: () => resumeForRequest(actor, waitForState),
      requestStarted: (inFlight) => activity.started(inFlight),
      requestEnded: (inFlight) => activity.ended(inFlight),
    },
    tokenKey: options.tokenKey,
    ...(options.tokenRevoked ? { revoked: options.tokenRevoked } : {}),
    ...(options.proxy?.upstreamTimeoutMs === undefined ? {} : { upstreamTimeoutMs: options.proxy.upstreamTimeoutMs }),
  });
  const activity = idleActivity(actor, () => proxy.inFlight, endDelayMs(options.idlePolicy));
  const endpoint = await proxy.listen(options.proxy?.port ?? 0, options.proxy?.host ?? "127.0.0.1");
  if (options.onSnapshot) actor.subscribe(options.onSnapshot);
  watchExit(actor, provider);
  actor.start();
  const suspendedTimer = options.persisted === undefined ? undefined : rearmSuspendedTimer(actor);

  return {
    microvmId: options.microvmId,
    endpoint,
    actor,
    proxy,
    state,
    send(event) {
      if (!canAccept(actor.getSnapshot(), event)) return false;
      actor.send(event);
      return true;
    },
    waitForState,
    async close(closing = {}) {
      if (closing.terminate !== false) {
        if (canAccept(actor.getSnapshot(), { type: "TERMINATE" }) && state() !== "TERMINATING") {
          actor.send({ type: "TERMINATE" });
        }
        await waitForState(["TERMINATED", "FAILED"]).catch(() => undefined);
      }
      activity.stop();
      clearTimeout(suspendedTimer);
      actor.stop();
      await proxy.close();
    },
  };
}

/**
 * Tells the machine about proxy activity only when its view changes: REQUEST_START when it
 * believes nothing is in flight, and REQUEST_END once the proxy has stayed empty for
 * `delayMs`. Telling it on every request made each one pay for two transitions and a record
 * check; the cost of coalescing is an idle clock that starts up to `delayMs` late (never early).
 */
function idleActivity(actor: LifecycleActor, inFlight: () => number, delayMs: number) {
  let pendingEnd: NodeJS.Timeout | undefined;
  /** What the machine believes is in flight; undefined once it has stopped. */
  const machineInFlight = () => {
    const snapshot = actor.getSnapshot();
    return snapshot.status === "active" ? snapshot.context.inFlight : undefined;
  };
  const sendEnd = () => {
    pendingEnd = undefined;
    if (inFlight() === 0 && (machineInFlight() ?? 0) > 0) actor.send({ type: "REQUEST_END", inFlight: 0 });
  };
  return {
    started(count: number) {
      if (machineInFlight() === 0) actor.send({ type: "REQUEST_START", inFlight: count });
    },
    ended(count: number) {
      if (count === 0 && pendingEnd === undefined) pendingEnd = setTimeout(sendEnd, delayMs).unref();
    },
    stop() {
      clearTimeout(pendingEnd);
      pendingEnd = undefined;
    },
  };
}

/** A small fraction of the idle limit, at most 50 ms: late enough to span back-to-back calls. */
function endDelayMs(policy: IdlePolicy): number {
  const idleMs = policy.maxIdleDurationSeconds * 1000;
  return Number.isFinite(idleMs) && idleMs > 0 ? Math.min(50, Math.max(1, idleMs / 4)) : 50;
}

/** The proxy's resume: wait out a suspend in progress, ask once, wait for RUNNING. */
async function resumeForRequest(
  actor: LifecycleActor,
  waitForState: (states: readonly MicrovmState[], timeoutMs?: number) => Promise<MicrovmState>,
): Promise<void> {
  let state = microvmState(actor.getSnapshot());
  // A suspend refused (its snapshot over its owner's quota) ends RUNNING: nothing to resume.
  if (state === "SUSPENDING")
    state = await waitForState(["SUSPENDED", "RUNNING", "FAILED", "TERMINATING", "TERMINATED"]);
  if (state === "SUSPENDED" && canAccept(actor.getSnapshot(), { type: "RESUME" })) actor.send({ type: "RESUME" });
  const reached = await waitForState(["RUNNING", "FAILED", "TERMINATING", "TERMINATED"]);
  if (reached !== "RUNNING") throw new Error(`instance did not resume (${reached})`);
}

/**
 * A persisted snapshot brings back states, not the timers its machine had armed: a SUSPENDED
 * one gets its suspendedDurationSeconds again, counted from when it was suspended.
 */
function rearmSuspendedTimer(actor: LifecycleActor): NodeJS.Timeout | undefined {
  const snapshot = actor.getSnapshot();
  const { context } = snapshot;
  const seconds = context.idlePolicy.suspendedDurationSeconds;
  if (!snapshot.matches({ SUSPENDED: "asleep" }) || !(seconds > 0)) return undefined;
  const anchor = context.timerAnchor;
  const timer = setTimeout(
    () => {
      const now = actor.getSnapshot();
      if (now.status !== "active" || now.context.timerAnchor !== anchor || !canAccept(now, { type: "TERMINATE" }))
        return;
      if (now.matches({ SUSPENDED: "asleep" }))
        actor.send({ type: "TERMINATE", reason: StateReason.SuspendedDurationElapsed });
    },
    remainingMs(seconds * 1000, anchor),
  );
  timer.unref();
  return timer;
}

function requireSnapshots(snapshots: InstanceSnapshots | undefined): InstanceSnapshots {
  if (!snapshots) throw new Error("this instance keeps no snapshots");
  return snapshots;
}

function memory(memoryMiB: number | undefined): { memoryMiB?: number } {
  return memoryMiB === undefined ? {} : { memoryMiB };
}

/**
 * An exit the provider did not cause makes the instance FAILED: each handle it has is watched
 * (a restore gives it a new one); the exit of a handle it no longer has is no news.
 */
function watchExit(actor: LifecycleActor, provider: MicrovmProvider): void {
  if (!provider.exited) return;
  let watched: MicrovmHandle | undefined;
  actor.subscribe((snapshot) => {
    const handle = snapshot.context.handle;
    if (!handle || handle === watched) return;
    watched = handle;
    void provider.exited!(handle).then((reason) => {
      const current = actor.getSnapshot();
      if (current.status === "active" && current.context.handle === handle) actor.send({ type: "EXITED", reason });
    });
  });
}

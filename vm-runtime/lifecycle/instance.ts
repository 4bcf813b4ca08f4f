// One managed instance: the lifecycle machine wired to a provider (its I/O) and to its proxy
// (activity drives the idle policy; a request to a suspended instance resumes it once).
// This is what a microVM actor holds per instance; persistence stays with the caller.
import { createActor, fromPromise, waitFor } from "xstate";
import { lifecycleMachine } from "./machine.ts";
import { canAccept, microvmState, type LifecycleActor, type LifecycleSnapshot } from "./snapshot.ts";
import type { LifecycleEvent, LifecycleTimeouts } from "./types.ts";
import { createInstanceProxy, type InstanceProxy } from "../host/proxy.ts";
import { upstreamOf, type MicrovmHandle, type MicrovmProvider } from "../host/provider.ts";
import type { IdlePolicy, MicrovmState } from "../../schemas/index.ts";
import type { TokenKey } from "../wire/token.ts";

export interface MicrovmInstanceOptions {
  readonly microvmId: string;
  /** Path of the image module the provider starts. */
  readonly image: string;
  readonly imageIdentifier?: string;
  readonly idlePolicy: IdlePolicy;
  readonly provider: MicrovmProvider;
  readonly tokenKey: TokenKey;
  readonly memoryMiB?: number;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** Where the proxy listens (default 127.0.0.1, a free port) and how long it waits for the app. */
  readonly proxy?: { readonly host?: string; readonly port?: number; readonly upstreamTimeoutMs?: number };
  /** Called after every transition (e.g. to persist `actor.getPersistedSnapshot()`). */
  readonly onSnapshot?: (snapshot: LifecycleSnapshot) => void;
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
  /** Terminates (if not already) and closes the proxy. */
  close(): Promise<void>;
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
    },
  });
  const actor = createActor(machine, {
    input: {
      microvmId: options.microvmId,
      idlePolicy: options.idlePolicy,
      ...(options.imageIdentifier === undefined ? {} : { imageIdentifier: options.imageIdentifier }),
      ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
    },
  });
  const state = () => microvmState(actor.getSnapshot());
  const waitForState = async (states: readonly MicrovmState[], timeoutMs = 30_000) =>
    microvmState(await waitFor(actor, (snapshot) => states.includes(microvmState(snapshot)), { timeout: timeoutMs }));

  const proxy = createInstanceProxy({
    microvmId: options.microvmId,
    tokenKey: options.tokenKey,
    state,
    resolveUpstream: (port) => {
      const handle: MicrovmHandle | undefined = actor.getSnapshot().context.handle;
      if (!handle) return undefined;
      return provider.upstream ? provider.upstream(handle, port) : upstreamOf(handle, port);
    },
    upstreamHeaders: () => actor.getSnapshot().context.handle?.upstreamHeaders,
    autoResume: () => options.idlePolicy.autoResumeEnabled,
    resume: () => resumeForRequest(actor, waitForState),
    ...(options.proxy?.upstreamTimeoutMs === undefined ? {} : { upstreamTimeoutMs: options.proxy.upstreamTimeoutMs }),
    hooks: {
      onRequestStart: (inFlight) => activity.started(inFlight),
      onRequestEnd: (inFlight) => activity.ended(inFlight),
    },
  });
  const activity = idleActivity(actor, () => proxy.inFlight, endDelayMs(options.idlePolicy));
  const endpoint = await proxy.listen(options.proxy?.port ?? 0, options.proxy?.host ?? "127.0.0.1");
  if (options.onSnapshot) actor.subscribe(options.onSnapshot);
  watchExit(actor, provider);
  actor.start();

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
    async close() {
      if (canAccept(actor.getSnapshot(), { type: "TERMINATE" }) && state() !== "TERMINATING") {
        actor.send({ type: "TERMINATE" });
      }
      await waitForState(["TERMINATED", "FAILED"]).catch(() => undefined);
      activity.stop();
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
  if (state === "SUSPENDING") state = await waitForState(["SUSPENDED", "FAILED", "TERMINATING", "TERMINATED"]);
  if (state === "SUSPENDED" && canAccept(actor.getSnapshot(), { type: "RESUME" })) actor.send({ type: "RESUME" });
  const reached = await waitForState(["RUNNING", "FAILED", "TERMINATING", "TERMINATED"]);
  if (reached !== "RUNNING") throw new Error(`instance did not resume (${reached})`);
}

function memory(memoryMiB: number | undefined): { memoryMiB?: number } {
  return memoryMiB === undefined ? {} : { memoryMiB };
}

/** Once the instance has a handle, an exit the provider did not cause makes it FAILED. */
function watchExit(actor: LifecycleActor, provider: MicrovmProvider): void {
  if (!provider.exited) return;
  let watched: MicrovmHandle | undefined;
  const subscription = actor.subscribe((snapshot) => {
    const handle = snapshot.context.handle;
    if (!handle || handle === watched) return;
    watched = handle;
    void provider.exited!(handle).then((reason) => {
      if (actor.getSnapshot().status === "active") actor.send({ type: "EXITED", reason });
    });
    subscription.unsubscribe();
  });
}

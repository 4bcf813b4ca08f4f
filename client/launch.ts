// The launch helper: an XState machine that runs RunMicrovm → polls GetMicrovm until RUNNING
// → CreateAuthToken → connects and makes a first call (retried) → runs the caller's work →
// TerminateMicrovm, always, whichever step failed. `launchMicrovm` resolves with the work's
// result or rejects with the first error, once the instance is terminated.
import { randomUUID } from "node:crypto";
import { assign, createActor, fromPromise, setup, toPromise } from "xstate";
import type { Static } from "@sinclair/typebox";
import type { AllowedPort, IdlePolicy } from "../schemas/index.ts";
import { connectMicrovm, type AnyShape, type MicrovmStub } from "../vm-runtime/index.ts";
import {
  connectStep,
  probe,
  runStep,
  terminateStep,
  tokenStep,
  waitRunningStep,
  type LaunchedMicrovm,
  type MicrovmApiClient,
} from "./microvm.ts";

export { MicrovmLaunchError, type LaunchedMicrovm, type MicrovmApiClient } from "./microvm.ts";

export interface LaunchOptions<S extends object> {
  /** Default `sandbox`. */
  readonly imageIdentifier?: string;
  /** Default: 5 min idle → suspend, 10 min suspended → terminate, auto-resume on. */
  readonly idlePolicy?: Partial<Static<typeof IdlePolicy>>;
  /** Longest wait for RUNNING (default 30 s). */
  readonly readyTimeoutMs?: number;
  /** Default: 15 minutes, port 8080. */
  readonly token?: { expirationInMinutes?: number; allowedPorts?: Static<typeof AllowedPort>[] };
  /** The first call, retried with backoff (default: the runtime's readiness probe). */
  readonly firstCall?: (stub: MicrovmStub<S>) => Promise<unknown>;
  /** Attempts of the first call (default 5) and the pause before the second (default 50 ms, doubling). */
  readonly firstCallAttempts?: number;
  readonly firstCallBackoffMs?: number;
  /** Fixes the microvmId (it is RunMicrovm's Idempotency-Key); default a fresh uuid v4. */
  readonly microvmId?: string;
  readonly fetch?: typeof fetch;
}

export type LaunchWork<S extends object, T> = (stub: MicrovmStub<S>, vm: LaunchedMicrovm) => Promise<T>;

interface LaunchContext {
  readonly microvmId: string;
  readonly endpoint?: string;
  readonly authToken?: string;
  readonly result?: unknown;
  /** The first failure; set once, terminate still runs. */
  readonly failure?: { readonly error: unknown };
}

export type LaunchOutput = { ok: true; result: unknown } | { ok: false; error: unknown };

const notProvided = (name: string) => async (): Promise<never> => {
  throw new Error(`launch step "${name}" was not provided`);
};

/** The machine; `launchMicrovm` provides its steps. Every failure path goes through `terminating`. */
export const launchMachine = setup({
  types: { context: {} as LaunchContext, input: {} as { microvmId: string }, output: {} as LaunchOutput },
  actors: {
    run: fromPromise<{ endpoint: string }, { microvmId: string }>(notProvided("run")),
    waitRunning: fromPromise<void, { microvmId: string }>(notProvided("waitRunning")),
    token: fromPromise<string, { microvmId: string }>(notProvided("token")),
    connect: fromPromise<void, LaunchedMicrovm>(notProvided("connect")),
    work: fromPromise<unknown, LaunchedMicrovm>(notProvided("work")),
    terminate: fromPromise<void, { microvmId: string }>(notProvided("terminate")),
  },
  actions: {
    fail: assign({ failure: ({ context, event }) => context.failure ?? { error: (event as { error?: unknown }).error } }),
  },
}).createMachine({
  id: "launch",
  context: ({ input }) => ({ microvmId: input.microvmId }),
  initial: "running",
  states: {
    running: {
      invoke: {
        src: "run",
        input: ({ context }) => ({ microvmId: context.microvmId }),
        onDone: { target: "waiting", actions: assign({ endpoint: ({ event }) => event.output.endpoint }) },
        // The outcome of a failed run may be unknown (timeout): terminating by id covers both.
        onError: { target: "terminating", actions: "fail" },
      },
    },
    waiting: {
      invoke: {
        src: "waitRunning",
        input: ({ context }) => ({ microvmId: context.microvmId }),
        onDone: "minting",
        onError: { target: "terminating", actions: "fail" },
      },
    },
    minting: {
      invoke: {
        src: "token",
        input: ({ context }) => ({ microvmId: context.microvmId }),
        onDone: { target: "connecting", actions: assign({ authToken: ({ event }) => event.output }) },
        onError: { target: "terminating", actions: "fail" },
      },
    },
    connecting: {
      invoke: {
        src: "connect",
        input: ({ context }) => launched(context),
        onDone: "working",
        onError: { target: "terminating", actions: "fail" },
      },
    },
    working: {
      invoke: {
        src: "work",
        input: ({ context }) => launched(context),
        onDone: { target: "terminating", actions: assign({ result: ({ event }) => event.output }) },
        onError: { target: "terminating", actions: "fail" },
      },
    },
    terminating: {
      invoke: {
        src: "terminate",
        input: ({ context }) => ({ microvmId: context.microvmId }),
        onDone: "done",
        // A work result is not handed back when its instance may still be running.
        onError: { target: "done", actions: "fail" },
      },
    },
    done: { type: "final" },
  },
  output: ({ context }) => (context.failure ? { ok: false, error: context.failure.error } : { ok: true, result: context.result }),
});

function stubFor<S extends object>(vm: LaunchedMicrovm, fetchImpl?: typeof fetch): MicrovmStub<S> {
  return connectMicrovm<S>({ endpoint: vm.endpoint, authToken: vm.authToken, ...(fetchImpl ? { fetch: fetchImpl } : {}) });
}

function launched(context: LaunchContext): LaunchedMicrovm {
  return { microvmId: context.microvmId, endpoint: context.endpoint ?? "", authToken: context.authToken ?? "" };
}

/**
 * Launches an instance, runs `work` against its stub, terminates it (always), and resolves
 * with `work`'s result or rejects with the first error (the work's own, or a step's).
 */
export async function launchMicrovm<S extends object = AnyShape, T = unknown>(
  api: MicrovmApiClient,
  work: LaunchWork<S, T>,
  options: LaunchOptions<S> = {},
): Promise<T> {
  const idlePolicy = { maxIdleDurationSeconds: 300, suspendedDurationSeconds: 600, autoResumeEnabled: true, ...options.idlePolicy };
  const token = { expirationInMinutes: 15, allowedPorts: [{ port: 8080 }], ...options.token };
  const machine = launchMachine.provide({
    actors: {
      run: fromPromise(({ input }) =>
        runStep(api, { microvmId: input.microvmId, imageIdentifier: options.imageIdentifier ?? "sandbox", idlePolicy }),
      ),
      waitRunning: fromPromise(({ input }) => waitRunningStep(api, input.microvmId, options.readyTimeoutMs ?? 30_000)),
      token: fromPromise(({ input }) => tokenStep(api, input.microvmId, token)),
      connect: fromPromise(async ({ input }) => {
        const retry = { attempts: options.firstCallAttempts ?? 5, backoffMs: options.firstCallBackoffMs ?? 50 };
        await connectStep<S>(input, options.firstCall ?? probe, retry, options.fetch);
      }),
      // The stub is rebuilt here rather than kept in context: it answers every property name.
      work: fromPromise(({ input }) => work(stubFor<S>(input, options.fetch), input)),
      terminate: fromPromise(({ input }) => terminateStep(api, input.microvmId)),
    },
  });
  const actor = createActor(machine, { input: { microvmId: options.microvmId ?? randomUUID() } });
  const output = toPromise(actor);
  actor.start();
  const outcome = await output;
  if (!outcome.ok) throw outcome.error;
  return outcome.result as T;
}

// The launch helper: RunMicrovm → poll GetMicrovm until RUNNING → CreateAuthToken → connect and
// make a first call (retried) → the caller's work → TerminateMicrovm, always, whichever step
// failed. `launchMicrovm` resolves with the work's result or rejects with the first error, once
// the instance is terminated.
import { randomUUID } from "node:crypto";
import { DEFAULT_IDLE_POLICY, type AllowedPort, type IdlePolicy } from "../schemas/index.ts";
import { connectMicrovm, type AnyShape, type MicrovmStub } from "../vm-runtime/index.ts";
import { ClientError } from "./client-error.ts";
import {
  connectStep,
  isTransient,
  probe,
  runStep,
  terminateStep,
  tokenStep,
  waitRunningStep,
  type LaunchedMicrovm,
  type MicrovmApiClient,
} from "./launch-steps.ts";

export { MicrovmLaunchError, type LaunchedMicrovm, type MicrovmApiClient } from "./launch-steps.ts";

export interface LaunchOptions<S extends object> {
  /** Default `sandbox`. */
  readonly imageIdentifier?: string;
  /** Default: 5 min idle → suspend, 10 min suspended → terminate, auto-resume on. */
  readonly idlePolicy?: Partial<IdlePolicy>;
  /** Longest wait for RUNNING (default 30 s). */
  readonly readyTimeoutMs?: number;
  /** Default: 15 minutes, port 8080. */
  readonly token?: { expirationInMinutes?: number; allowedPorts?: AllowedPort[] };
  /** The first call, retried with backoff (default: the runtime's readiness probe). */
  readonly firstCall?: (stub: MicrovmStub<S>) => Promise<unknown>;
  /** Attempts of the first call (default 5) and the pause before the second (default 50 ms, doubling). */
  readonly firstCallAttempts?: number;
  readonly firstCallBackoffMs?: number;
  /**
   * RunMicrovm's Idempotency-Key, which fixes the instance (its id is derived from the key and
   * the caller's principal); default a fresh uuid v4.
   */
  readonly idempotencyKey?: string;
  readonly fetch?: typeof fetch;
}

export type LaunchWork<S extends object, T> = (stub: MicrovmStub<S>, vm: LaunchedMicrovm) => Promise<T>;

/**
 * Launches an instance, runs `work` against its stub, terminates it (always), and resolves
 * with `work`'s result or rejects with the first error (the work's own, or a step's). A work
 * result is not handed back when the terminate failed: its instance may still be running.
 */
export async function launchMicrovm<S extends object = AnyShape, T = unknown>(
  api: MicrovmApiClient,
  work: LaunchWork<S, T>,
  options: LaunchOptions<S> = {},
): Promise<T> {
  const idempotencyKey = options.idempotencyKey ?? randomUUID();
  let microvmId: string | undefined;
  let runOutcomeUnknown = false;
  const idlePolicy = { ...DEFAULT_IDLE_POLICY, ...options.idlePolicy };
  const token = { expirationInMinutes: 15, allowedPorts: [{ port: 8080 }], ...options.token };
  const fetchOption = options.fetch ? { fetch: options.fetch } : {};
  let failed = false;
  const runInput = { idempotencyKey, imageIdentifier: options.imageIdentifier ?? "sandbox", idlePolicy };
  try {
    const run = await runStep(api, runInput).catch((err: unknown) => {
      // A declared refusal (4xx) launched nothing; anything else may have.
      runOutcomeUnknown = !(err instanceof ClientError) || err.status >= 500 || isTransient(err);
      throw err;
    });
    microvmId = run.microvmId;
    const endpoint = run.endpoint;
    await waitRunningStep(api, microvmId, options.readyTimeoutMs ?? 30_000);
    const vm: LaunchedMicrovm = { microvmId, endpoint, authToken: await tokenStep(api, microvmId, token) };
    const retry = { attempts: options.firstCallAttempts ?? 5, backoffMs: options.firstCallBackoffMs ?? 50 };
    await connectStep<S>(vm, options.firstCall ?? probe, retry, options.fetch);
    return await work(connectMicrovm<S>({ endpoint: vm.endpoint, authToken: vm.authToken, ...fetchOption }), vm);
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    // A run that timed out may have launched: the same key, asked once more, answers that
    // instance (or launches one), and the terminate below covers it either way.
    if (runOutcomeUnknown)
      microvmId = await runStep(api, runInput, 1).then(
        (run) => run.microvmId,
        () => undefined,
      );
    // The first error wins: a failed terminate after a failed step is not reported over it.
    if (microvmId !== undefined)
      await terminateStep(api, microvmId).catch((err: unknown) => {
        if (!failed) throw err;
      });
  }
}

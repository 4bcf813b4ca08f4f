// The steps of a microVM launch as plain async functions over a typed microVM client (NATS or
// HTTP): run with a fixed Idempotency-Key (safe to retry), poll until RUNNING, mint a token,
// first call with backoff, terminate. `launch.ts` runs them in order, terminate always last.
import type { AllowedPort, IdlePolicy, microvmApi } from "../schemas/index.ts";
import { connectMicrovm, type MicrovmStub } from "../vm-runtime/index.ts";
import { ClientError } from "./client-error.ts";
import type { Client } from "./typed-client.ts";

export type MicrovmApiClient = Client<typeof microvmApi>;

/** A launched instance, as the caller's work sees it. */
export interface LaunchedMicrovm {
  readonly microvmId: string;
  readonly endpoint: string;
  /** The `X-aws-proxy-auth` token. */
  readonly authToken: string;
}

/** A launch step failed on its own terms (the instance ended, or did not get RUNNING in time). */
export class MicrovmLaunchError extends Error {
  override readonly name = "MicrovmLaunchError";
  constructor(
    readonly step: "run" | "waitRunning" | "firstCall",
    readonly microvmId: string,
    message: string,
    readonly state?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Transport trouble whose outcome is unknown: worth repeating a request that is safe to repeat. */
export function isTransient(err: unknown): boolean {
  return err instanceof ClientError && (err._tag === "ServiceUnavailable" || err._tag === "GatewayTimeout");
}

export interface RetryOptions {
  readonly attempts: number;
  /** Pause before the second attempt; doubles each time. */
  readonly backoffMs: number;
  readonly retryable?: (err: unknown) => boolean;
}

export async function retrying<T>(attempt: () => Promise<T>, options: RetryOptions): Promise<T> {
  let pause = options.backoffMs;
  for (let n = 1; ; n++) {
    try {
      return await attempt();
    } catch (err) {
      if (n >= options.attempts || !(options.retryable?.(err) ?? true)) throw err;
      await sleep(pause);
      pause *= 2;
    }
  }
}

export interface RunInput {
  /** Fixes the instance (the service derives its id from the key and the caller's principal). */
  readonly idempotencyKey: string;
  readonly imageIdentifier: string;
  readonly idlePolicy: IdlePolicy;
}

/** RunMicrovm with a fixed Idempotency-Key: a retry never launches a second instance. */
export async function runStep(
  api: MicrovmApiClient,
  input: RunInput,
  attempts = 4,
): Promise<{ microvmId: string; endpoint: string }> {
  const run = () =>
    api.runMicrovm(
      { imageIdentifier: input.imageIdentifier, idlePolicy: input.idlePolicy },
      { idempotencyKey: input.idempotencyKey },
    );
  const answer = await retrying(run, { attempts, backoffMs: 100, retryable: isTransient });
  return { microvmId: answer.microvmId, endpoint: answer.endpoint };
}

/** Polls GetMicrovm (25 ms, growing to 250 ms) until RUNNING; an ended instance or the deadline fails. */
export async function waitRunningStep(api: MicrovmApiClient, microvmId: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let pause = 25;
  for (;;) {
    const vm = await api.getMicrovm({ microvmIdentifier: microvmId }).catch((err: unknown) => {
      if (isTransient(err)) return undefined;
      throw err;
    });
    if (vm?.state === "RUNNING") return;
    if (vm && ["FAILED", "TERMINATING", "TERMINATED"].includes(vm.state)) {
      throw new MicrovmLaunchError(
        "waitRunning",
        microvmId,
        `instance ${microvmId} is ${vm.state}${vm.stateReason ? ` (${vm.stateReason})` : ""}`,
        vm.state,
      );
    }
    if (Date.now() + pause > deadline) {
      throw new MicrovmLaunchError(
        "waitRunning",
        microvmId,
        `instance ${microvmId} not RUNNING after ${timeoutMs} ms`,
        vm?.state,
      );
    }
    await sleep(pause);
    pause = Math.min(250, Math.round(pause * 1.5));
  }
}

export async function tokenStep(
  api: MicrovmApiClient,
  microvmId: string,
  token: { expirationInMinutes: number; allowedPorts: AllowedPort[] },
): Promise<string> {
  const answer = await retrying(() => api.createAuthToken({ microvmIdentifier: microvmId, ...token }), {
    attempts: 3,
    backoffMs: 100,
    retryable: isTransient,
  });
  return answer.authToken["X-aws-proxy-auth"];
}

/** The default first call: the runtime's readiness probe (`GET /__rpc__/`) through the proxy. */
export async function probe(stub: MicrovmStub<object>): Promise<void> {
  const response = await stub.fetch("/__rpc__/");
  await response.arrayBuffer();
  if (!response.ok) throw new Error(`readiness probe answered ${response.status}`);
}

/** Makes the first call through a fresh stub, retried with backoff (the proxy may not route yet). */
export async function connectStep<S extends object>(
  vm: LaunchedMicrovm,
  firstCall: (stub: MicrovmStub<S>) => Promise<unknown>,
  retry: RetryOptions,
  fetchImpl?: typeof fetch,
): Promise<void> {
  const stub = connectMicrovm<S>({
    endpoint: vm.endpoint,
    authToken: vm.authToken,
    ...(fetchImpl ? { fetch: fetchImpl } : {}),
  });
  try {
    await retrying(() => firstCall(stub), retry);
  } catch (cause) {
    throw new MicrovmLaunchError("firstCall", vm.microvmId, `first call to ${vm.microvmId} failed`, undefined, {
      cause,
    });
  }
}

/** TerminateMicrovm, retried on transport trouble; an instance that never existed is fine. */
export async function terminateStep(api: MicrovmApiClient, microvmId: string): Promise<void> {
  try {
    await retrying(() => api.terminateMicrovm({ microvmIdentifier: microvmId }), {
      attempts: 4,
      backoffMs: 100,
      retryable: isTransient,
    });
  } catch (err) {
    if (err instanceof ClientError && err._tag === "MicrovmNotFound") return;
    throw err;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

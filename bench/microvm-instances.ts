// Instance steps for the microVM bench, timed: RunMicrovm, polling GetMicrovm (~5 ms) until
// a state, CreateAuthToken, the first `stub.hello` through the proxy, TerminateMicrovm.
// Every instance launched here is remembered, so the bench can terminate it whatever happens.
import { connectMicrovm, type MicrovmStub, type SandboxShape } from "../vm-runtime/index.ts";
import type { MicrovmState } from "../schemas/index.ts";
import type { Client } from "../client/index.ts";
import type { microvmApi } from "../schemas/index.ts";
import { pause as sleep } from "./stats.ts";

/** The microVM API straight over NATS (RunMicrovm & co.). */
export type MicrovmClient = Client<typeof microvmApi>;

/** Long enough that nothing suspends or ends on its own while the bench measures. */
export const benchPolicy = { maxIdleDurationSeconds: 3_600, suspendedDurationSeconds: 3_600, autoResumeEnabled: true };

export const POLL_MS = 5;

const ended: readonly string[] = ["FAILED", "TERMINATING", "TERMINATED"];

export interface Launched {
  microvmId: string;
  endpoint: string;
  /** RunMicrovm answered (PENDING), ms after the request. */
  runMs: number;
  /** GetMicrovm first said RUNNING, ms after RunMicrovm was sent. */
  runningMs: number;
  /** Wall clock (epoch ms) of that answer, to compare with the record's timestamps. */
  runningAt: number;
}

export interface Connected extends Launched {
  token: string;
  stub: MicrovmStub<SandboxShape>;
  /** The first `hello` resolved, ms after RunMicrovm was sent. */
  firstRpcMs: number;
}

/** Ids of every instance this run launched (terminated ones too). */
export const launchedIds = new Set<string>();

/** Polls GetMicrovm every ~POLL_MS until one of `states`; throws if the instance ends first. */
export async function waitForState(
  api: MicrovmClient,
  microvmId: string,
  states: readonly MicrovmState[],
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const vm = await api.getMicrovm({ microvmIdentifier: microvmId });
    if (states.includes(vm.state as MicrovmState)) return;
    if (ended.includes(vm.state) && !states.some((s) => ended.includes(s))) {
      throw new Error(`instance ${microvmId} is ${vm.state}${vm.stateReason ? ` (${vm.stateReason})` : ""}`);
    }
    if (Date.now() > deadline) throw new Error(`instance ${microvmId} still ${vm.state} after ${timeoutMs} ms`);
    await sleep(POLL_MS);
  }
}

/** RunMicrovm, then GetMicrovm every ~5 ms until RUNNING. */
export async function launch(api: MicrovmClient, imageIdentifier = "sandbox"): Promise<Launched> {
  const started = performance.now();
  const run = await api.runMicrovm({ imageIdentifier, idlePolicy: benchPolicy });
  launchedIds.add(run.microvmId);
  const runMs = performance.now() - started;
  await waitForState(api, run.microvmId, ["RUNNING"]);
  return {
    microvmId: run.microvmId,
    endpoint: run.endpoint,
    runMs,
    runningMs: performance.now() - started,
    runningAt: Date.now(),
  };
}

export async function mintToken(api: MicrovmClient, microvmId: string): Promise<string> {
  const answer = await api.createAuthToken({
    microvmIdentifier: microvmId,
    expirationInMinutes: 60,
    allowedPorts: [{ port: 8080 }],
  });
  return answer.authToken["X-aws-proxy-auth"];
}

/**
 * Waits until the host behind `microvmUrl` has `count` walls booted ahead up and waiting (its
 * `microvm_boots{state="ready"}` metric), at most `limitMs`; resolves with the time waited.
 */
export async function wallReady(microvmUrl: string, limitMs = 60_000, count = 1): Promise<number> {
  const started = performance.now();
  for (;;) {
    const text = await (await fetch(`${microvmUrl}/metrics`)).text();
    const ready = Number(/^microvm_boots\{state="ready"\} (\d+)$/m.exec(text)?.[1] ?? 0);
    const waited = performance.now() - started;
    if (ready >= count || waited >= limitMs) return waited;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** RunMicrovm with `wait: "running"`: the service answers once the instance's runtime answers. */
export async function launchWaiting(api: MicrovmClient, imageIdentifier = "sandbox"): Promise<Launched> {
  const started = performance.now();
  const run = await api.runMicrovm({ imageIdentifier, idlePolicy: benchPolicy, wait: "running" });
  launchedIds.add(run.microvmId);
  if (run.state !== "RUNNING") throw new Error(`RunMicrovm with wait answered ${run.state}`);
  const ms = performance.now() - started;
  return { microvmId: run.microvmId, endpoint: run.endpoint, runMs: ms, runningMs: ms, runningAt: Date.now() };
}

/**
 * The launch helper's path: RunMicrovm → RUNNING → token → first `hello("x")` through the proxy.
 * RUNNING is RunMicrovm's own answer (`wait: "running"`, as docs/microvms.md advises), or with
 * `poll`, GetMicrovm's every ~5 ms after a RunMicrovm that answers PENDING (the lifecycle rows
 * time both answers).
 */
export async function launchAndCall(api: MicrovmClient, options: { poll?: boolean } = {}): Promise<Connected> {
  const started = performance.now();
  const launched = options.poll ? await launch(api) : await launchWaiting(api);
  const token = await mintToken(api, launched.microvmId);
  const stub = connectMicrovm<SandboxShape>({ endpoint: launched.endpoint, authToken: token });
  await expectHello(stub);
  return { ...launched, token, stub, firstRpcMs: performance.now() - started };
}

/** No polling: token right after RunMicrovm, `hello` retried every ~5 ms until it answers. */
export async function launchEager(
  api: MicrovmClient,
): Promise<{ microvmId: string; firstRpcMs: number; attempts: number }> {
  const started = performance.now();
  const run = await api.runMicrovm({ imageIdentifier: "sandbox", idlePolicy: benchPolicy });
  launchedIds.add(run.microvmId);
  const stub = connectMicrovm<SandboxShape>({ endpoint: run.endpoint, authToken: await mintToken(api, run.microvmId) });
  for (let attempts = 1; ; attempts++) {
    try {
      await expectHello(stub);
      return { microvmId: run.microvmId, firstRpcMs: performance.now() - started, attempts };
    } catch (err) {
      if (performance.now() - started > 30_000) throw err;
      await sleep(POLL_MS);
    }
  }
}

export async function expectHello(stub: MicrovmStub<SandboxShape>): Promise<void> {
  const answer = await stub.hello("x");
  if (answer !== "hello, x!") throw new Error(`hello answered ${JSON.stringify(answer)}`);
}

/** TerminateMicrovm; resolves with its latency in ms. */
export async function terminate(api: MicrovmClient, microvmId: string): Promise<number> {
  const started = performance.now();
  const answer = await api.terminateMicrovm({ microvmIdentifier: microvmId });
  if (answer.state !== "TERMINATED") await waitForState(api, microvmId, ["TERMINATED", "FAILED"]);
  return performance.now() - started;
}

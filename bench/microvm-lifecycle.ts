// Launch and suspend/resume latency for the microVM bench: RunMicrovm → RUNNING and → first
// RPC (sequential launches, each terminated), where a launch's time goes (from the KV record's
// timestamps), SuspendMicrovm/ResumeMicrovm until GetMicrovm shows the state, and the first
// request through the proxy to a suspended instance (auto-resume).
import type { KV } from "@nats-io/kv";
import { idKey } from "../schemas/index.ts";
import { keepAliveAgent, rawRpc, targetOf } from "./microvm-http.ts";
import { percentiles, type Percentiles } from "./stats.ts";
import {
  launchAndCall,
  launchEager,
  terminate,
  waitForState,
  type Connected,
  type MicrovmClient,
} from "./microvm-instances.ts";

export interface LaunchResults {
  launches: number;
  /** The first launch on a fresh host (it bundles the image with esbuild first): not in the others. */
  coldFirstRpcMs: number;
  /** RunMicrovm answered (PENDING). */
  runAnswered: Percentiles;
  /** RunMicrovm → GetMicrovm says RUNNING. */
  running: Percentiles;
  /** RunMicrovm → RUNNING → CreateAuthToken → first stub.hello answered. */
  firstRpc: Percentiles;
  /** RunMicrovm → CreateAuthToken at once → stub.hello retried every ~5 ms until it answers. */
  firstRpcEager: Percentiles;
  terminate: Percentiles;
  /** Where RunMicrovm → RUNNING went, from the record's timestamps (ms resolution). */
  breakdown: { providerStart: Percentiles; recordWrite: Percentiles; observedAfterWrite: Percentiles };
}

interface StoredTimes {
  startedAt: string;
  updatedAt: string;
  handle?: { startedAt: string };
}

/**
 * Launch samples of one host, taken a step at a time so the bench can interleave hosts (load
 * changes on the machine then hit each alike): one cold launch, then steps of one launch by
 * each path, alternating; each instance is terminated before the next.
 */
export function launchSampler(api: MicrovmClient, kv: KV) {
  const samples = {
    run: [] as number[],
    running: [] as number[],
    first: [] as number[],
    eager: [] as number[],
    term: [] as number[],
  };
  const parts = { providerStart: [] as number[], recordWrite: [] as number[], observedAfterWrite: [] as number[] };
  let coldFirstRpcMs = NaN;
  return {
    async cold(): Promise<void> {
      const cold = await launchAndCall(api, { poll: true });
      coldFirstRpcMs = Math.round(cold.firstRpcMs);
      await terminate(api, cold.microvmId);
    },
    async step(): Promise<void> {
      const vm = await launchAndCall(api, { poll: true });
      const times = (await kv.get(idKey(vm.microvmId)!))?.json<StoredTimes>();
      if (times?.handle) {
        const [machineStart, ready, written] = [times.startedAt, times.handle.startedAt, times.updatedAt].map((iso) =>
          Date.parse(iso),
        );
        parts.providerStart.push(ready! - machineStart!);
        parts.recordWrite.push(written! - ready!);
        parts.observedAfterWrite.push(vm.runningAt - written!);
      }
      samples.run.push(vm.runMs);
      samples.running.push(vm.runningMs);
      samples.first.push(vm.firstRpcMs);
      samples.term.push(await terminate(api, vm.microvmId));
      // Interleaved with the polled path, so load changes on the machine hit both alike.
      const eager = await launchEager(api);
      samples.eager.push(eager.firstRpcMs);
      await terminate(api, eager.microvmId);
    },
    results(): LaunchResults {
      return {
        launches: samples.first.length,
        coldFirstRpcMs,
        runAnswered: percentiles(samples.run),
        running: percentiles(samples.running),
        firstRpc: percentiles(samples.first),
        firstRpcEager: percentiles(samples.eager),
        terminate: percentiles(samples.term),
        breakdown: {
          providerStart: percentiles(parts.providerStart),
          recordWrite: percentiles(parts.recordWrite),
          observedAfterWrite: percentiles(parts.observedAfterWrite),
        },
      };
    },
  };
}

export interface SuspendResults {
  cycles: number;
  /** SuspendMicrovm answered; then GetMicrovm showed SUSPENDED (from the request). */
  suspendAnswer: Percentiles;
  suspendObserved: Percentiles;
  resumeAnswer: Percentiles;
  resumeObserved: Percentiles;
  /** A raw RPC through the proxy to a SUSPENDED instance (auto-resume), and the call after it. */
  autoResumeFirstCall: Percentiles;
  callAfterAutoResume: Percentiles;
}

/** `cycles` suspend/resume cycles by the operations, then as many auto-resumes by a request. */
export async function measureSuspendResume(api: MicrovmClient, vm: Connected, cycles: number): Promise<SuspendResults> {
  const s = {
    sa: [] as number[],
    so: [] as number[],
    ra: [] as number[],
    ro: [] as number[],
    auto: [] as number[],
    after: [] as number[],
  };
  const timed = async (
    op: () => Promise<unknown>,
    state: "SUSPENDED" | "RUNNING",
    answer: number[],
    observed: number[],
  ) => {
    const started = performance.now();
    await op();
    answer.push(performance.now() - started);
    await waitForState(api, vm.microvmId, [state]);
    observed.push(performance.now() - started);
  };
  const id = { microvmIdentifier: vm.microvmId };
  for (let i = 0; i < cycles; i++) {
    await timed(() => api.suspendMicrovm(id), "SUSPENDED", s.sa, s.so);
    await timed(() => api.resumeMicrovm(id), "RUNNING", s.ra, s.ro);
  }
  const call = rawRpc(targetOf(vm.endpoint, { "x-aws-proxy-auth": vm.token }), keepAliveAgent(1), "hello", ["x"]);
  for (let i = 0; i < cycles; i++) {
    await api.suspendMicrovm(id);
    await waitForState(api, vm.microvmId, ["SUSPENDED"]);
    for (const samples of [s.auto, s.after]) {
      const started = performance.now();
      const status = await call();
      if (status !== 200) throw new Error(`call to a suspended instance answered ${status}`);
      samples.push(performance.now() - started);
    }
  }
  await waitForState(api, vm.microvmId, ["RUNNING"]);
  return {
    cycles,
    suspendAnswer: percentiles(s.sa),
    suspendObserved: percentiles(s.so),
    resumeAnswer: percentiles(s.ra),
    resumeObserved: percentiles(s.ro),
    autoResumeFirstCall: percentiles(s.auto),
    callAfterAutoResume: percentiles(s.after),
  };
}

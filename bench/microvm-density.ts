// Density for the microVM bench: with 1, 10, 50… live instances (each has answered one RPC),
// the memory per instance process (VmRSS, PSS, private anonymous) and of the service, RPC
// latency through the proxy, and RunMicrovm → RUNNING of a few more launches at that level.
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { keepAliveAgent, percentiles, rawRpc, sequential, targetOf, type Percentiles } from "./microvm-http.ts";
import { launch, launchAndCall, terminate, type Connected } from "./microvm-instances.ts";
import { memoryKiB, memoryOf, type MemoryMiB } from "./microvm-proc.ts";

export interface DensityPoint {
  live: number;
  /** Instance processes found under the service (must equal `live`). */
  processes: number;
  perInstance: MemoryMiB;
  serviceMiB: MemoryMiB;
  /** Raw keep-alive RPC through the proxy of the first instance. */
  rpc: Percentiles;
  /** RunMicrovm → RUNNING of extra launches at this level (each terminated after). */
  running: Percentiles;
}

export interface DensitySettings {
  levels: number[];
  rpcCalls: number;
  extraLaunches: number;
  /** Launches in flight while filling up to a level (not measured). */
  fillConcurrency: number;
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const kibToMiB = (m: MemoryMiB): MemoryMiB => ({ rss: mib(m.rss), pss: mib(m.pss), anon: mib(m.anon) });
const mib = (kib: number) => Math.round((kib / 1024) * 10) / 10;

export async function measureDensity(env: MicrovmEnvironment, settings: DensitySettings, report: (point: DensityPoint) => void): Promise<DensityPoint[]> {
  const live: Connected[] = [];
  const points: DensityPoint[] = [];
  try {
    for (const level of settings.levels) {
      await fill(env, live, level, settings.fillConcurrency);
      await pause(1_000); // let start-up garbage settle before reading memory
      const memory = memoryOf(env.instancePids());
      const serviceMiB = kibToMiB(memoryKiB(env.servicePid));
      const first = live[0]!;
      const call = rawRpc(targetOf(first.endpoint, { "x-aws-proxy-auth": first.token }), keepAliveAgent(1), "hello", ["x"]);
      const rpc = await sequential(call, settings.rpcCalls);
      const running: number[] = [];
      for (let i = 0; i < settings.extraLaunches; i++) {
        const vm = await launch(env.api);
        running.push(vm.runningMs);
        await terminate(env.api, vm.microvmId);
      }
      const point = { live: live.length, processes: memory.count, perInstance: memory.each, serviceMiB, rpc, running: percentiles(running) };
      points.push(point);
      report(point);
    }
  } finally {
    await Promise.all(live.map((vm) => terminate(env.api, vm.microvmId).catch(() => undefined)));
  }
  return points;
}

async function fill(env: MicrovmEnvironment, live: Connected[], level: number, concurrency: number): Promise<void> {
  while (live.length < level) {
    const batch = Math.min(concurrency, level - live.length);
    live.push(...(await Promise.all(Array.from({ length: batch }, () => launchAndCall(env.api)))));
  }
}

// Density for the microVM bench: with 1, 10, 50… live instances (each has answered one RPC),
// the memory per instance (VmRSS, PSS, private anonymous, summed over all of its processes:
// node, and bwrap's two for the sandbox; plus what its cgroup is charged) and of the service,
// RPC latency through the proxy, and RunMicrovm → RUNNING of a few more launches at that level.
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { keepAliveAgent, rawRpc, sequential, targetOf } from "./microvm-http.ts";
import { percentiles, type Percentiles, pause } from "./stats.ts";
import { launch, launchAndCall, terminate, type Connected } from "./microvm-instances.ts";
import { cgroupMemoryKiB } from "./microvm-instance-procs.ts";
import { memoryKiB, memoryOf, type MemoryMiB } from "./proc.ts";

export interface DensityPoint {
  live: number;
  /** Instances found under the service (must equal `live`), and their processes in all. */
  instances: number;
  processes: number;
  /** Summed over each instance's processes, mean per instance. */
  perInstance: MemoryMiB;
  /** Charged to each instance's memory cgroup (sandbox only), mean per instance, MiB. */
  cgroupPerInstance?: { usage: number; anon: number };
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

const kibToMiB = (m: MemoryMiB): MemoryMiB => ({ rss: mib(m.rss), pss: mib(m.pss), anon: mib(m.anon) });
const mib = (kib: number, n = 1) => Math.round((kib / 1024 / Math.max(1, n)) * 10) / 10;

function cgroupMean(dirs: string[]): { usage: number; anon: number } | undefined {
  if (dirs.length === 0) return undefined;
  const all = dirs.map(cgroupMemoryKiB);
  return {
    usage: mib(
      all.reduce((sum, m) => sum + m.usage, 0),
      dirs.length,
    ),
    anon: mib(
      all.reduce((sum, m) => sum + m.anon, 0),
      dirs.length,
    ),
  };
}

/** The levels measured, and why the next was not (a launch that failed or timed out on the way). */
export async function measureDensity(
  env: MicrovmEnvironment,
  settings: DensitySettings,
  report: (point: DensityPoint) => void,
  failures: string[],
): Promise<DensityPoint[]> {
  const live: Connected[] = [];
  const points: DensityPoint[] = [];
  try {
    for (const level of settings.levels) {
      try {
        await fill(env, live, level, settings.fillConcurrency);
      } catch (err) {
        // What the host could not reach is a finding: said, and the levels measured kept.
        failures.push(`filling to ${level} live stopped at ${live.length}: ${(err as Error).message}`);
        break;
      }
      await pause(1_000); // let start-up garbage settle before reading memory
      const instances = env.instances();
      const memory = memoryOf(instances.flatMap((i) => i.pids));
      const each = (mibTotal: number) => Math.round((mibTotal / Math.max(1, instances.length)) * 10) / 10;
      const perInstance = { rss: each(memory.total.rss), pss: each(memory.total.pss), anon: each(memory.total.anon) };
      const cgroupPerInstance = cgroupMean(instances.flatMap((i) => (i.memoryCgroup ? [i.memoryCgroup] : [])));
      const serviceMiB = kibToMiB(memoryKiB(env.servicePid));
      const first = live[0]!;
      const call = rawRpc(targetOf(first.endpoint, { "x-aws-proxy-auth": first.token }), keepAliveAgent(1), "hello", [
        "x",
      ]);
      const rpc = await sequential(call, settings.rpcCalls);
      const running: number[] = [];
      for (let i = 0; i < settings.extraLaunches; i++) {
        const vm = await launch(env.api);
        running.push(vm.runningMs);
        await terminate(env.api, vm.microvmId);
      }
      const point: DensityPoint = {
        live: live.length,
        instances: instances.length,
        processes: memory.count,
        perInstance,
        serviceMiB,
        rpc,
        running: percentiles(running),
        ...(cgroupPerInstance ? { cgroupPerInstance } : {}),
      };
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

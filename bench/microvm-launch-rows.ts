// The launch rows of the default run (issue 55's targets), through the service as a user sees
// them: 10 RunMicrovm → first RPC at once, then what 10 idle instances add to the machine's used
// memory (MemTotal - MemAvailable: every process of theirs, the host's side included, read once
// their runtimes' collection once idle ran), and on a second service with no wall booted ahead,
// launches one after another.
import { readFileSync } from "node:fs";
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { withMicrovmEnvironment } from "./microvm-environment.ts";
import { launchAndCall, terminate } from "./microvm-instances.ts";
import { IDLE_GC_AFTER_MS } from "../vm-runtime/runtime/idle-gc.ts";
import { pause, percentiles, type Percentiles } from "./stats.ts";

/** Issue 55's launch and memory targets (p50/p95 ms, MiB per idle instance). */
export const launchTargets = { warmP50Ms: 150, burstP95Ms: 400, noWarmP50Ms: 600, idleMiB: 24 } as const;

export interface LaunchRows {
  /** 10 launches at once: each RunMicrovm → first RPC. */
  burst: Percentiles & { p95: number };
  /** RunMicrovm → first RPC, one after another, no wall booted ahead. */
  noWarm: Percentiles;
  /** The machine's used memory each idle instance adds (MiB), over `idleInstances`. */
  idleMachineMiB: number;
  idleInstances: number;
}

/** Settling time before a memory reading: the pool's wall refilled, page cache writes done. */
const SETTLE_MS = 3_000;
/** Idle instances are read once their runtime's collection once idle has run. */
const IDLE_MS = IDLE_GC_AFTER_MS + SETTLE_MS;

const usedKiB = () => {
  const text = readFileSync("/proc/meminfo", "utf8");
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(text)?.[1] ?? 0);
  return field("MemTotal") - field("MemAvailable");
};

const p95 = (samples: number[]) => [...samples].sort((a, b) => a - b)[Math.ceil(0.95 * samples.length) - 1] ?? NaN;

/** The burst and idle-memory rows on `env` (its warm pool on), then the no-warm launches on a service of their own. */
export async function measureLaunchRows(env: MicrovmEnvironment, launches: number): Promise<LaunchRows> {
  const burst = await Promise.all(Array.from({ length: 10 }, () => launchAndCall(env.api)));
  await Promise.all(burst.map((vm) => terminate(env.api, vm.microvmId)));
  const idleInstances = 10;
  await pause(SETTLE_MS);
  const before = usedKiB();
  const idle = [];
  for (let i = 0; i < idleInstances; i++) idle.push(await launchAndCall(env.api));
  await pause(IDLE_MS);
  const idleMachineMiB = +((usedKiB() - before) / 1024 / idleInstances).toFixed(1);
  for (const vm of idle) await terminate(env.api, vm.microvmId);
  const noWarm = await withMicrovmEnvironment(
    { provider: "gvisor", maxInstances: 4, serviceEnv: { MICROVM_WARM_INSTANCES: "0" } },
    `${launches} launches one after another with no wall booted ahead`,
    async (cold) => {
      const samples: number[] = [];
      for (let i = 0; i < launches; i++) {
        const vm = await launchAndCall(cold.api);
        samples.push(vm.firstRpcMs);
        await terminate(cold.api, vm.microvmId);
      }
      return samples;
    },
  );
  const burstMs = burst.map((vm) => vm.firstRpcMs);
  return {
    burst: { ...percentiles(burstMs), p95: Math.round(p95(burstMs)) },
    noWarm: percentiles(noWarm),
    idleMachineMiB,
    idleInstances,
  };
}

/** The rows and the verdicts; `warm` is the snapshot rows' RunMicrovm → first RPC (a wall waiting). */
export function formatLaunchRows(rows: LaunchRows, warm: Percentiles): string {
  const verdict = (met: boolean) => (met ? "met" : "missed");
  return [
    "| RunMicrovm → first RPC, and memory | measured | target (idle machine) | verdict |",
    "| --- | --- | --- | --- |",
    `| a wall booted ahead, p50 | ${warm.p50.toFixed(0)} ms | ≤ ${launchTargets.warmP50Ms} ms | ` +
      `${verdict(warm.p50 <= launchTargets.warmP50Ms)} |`,
    `| 10 at once, p95 (p50 ${rows.burst.p50.toFixed(0)} ms) | ${rows.burst.p95} ms | ≤ ${launchTargets.burstP95Ms} ms | ` +
      `${verdict(rows.burst.p95 <= launchTargets.burstP95Ms)} |`,
    `| no wall booted ahead, p50 | ${rows.noWarm.p50.toFixed(0)} ms | ≤ ${launchTargets.noWarmP50Ms} ms | ` +
      `${verdict(rows.noWarm.p50 <= launchTargets.noWarmP50Ms)} |`,
    `| machine memory per idle instance (${rows.idleInstances} idle) | ${rows.idleMachineMiB} MiB | ` +
      `≤ ${launchTargets.idleMiB} MiB | ${verdict(rows.idleMachineMiB <= launchTargets.idleMiB)} |`,
  ].join("\n");
}

// The launch rows of the default run, through the service as a user sees them: 10 RunMicrovm →
// first RPC at once with the default pool of walls booted ahead; on a second service with no wall
// booted ahead, launches one after another; on a third, with launch snapshots off too, 10
// instances started cold, then what they cost idle (microvm-idle-memory.ts); on a fourth with 10
// walls booted ahead, what those walls hold and 10 launches at once.
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { withMicrovmEnvironment } from "./microvm-environment.ts";
import {
  memoryBaseline,
  readIdleCpu,
  readIdleMemory,
  warmWallsMiB,
  type IdleCpu,
  type IdleMemory,
} from "./microvm-idle-memory.ts";
import { launchAndCall, terminate, wallReady, type MicrovmClient } from "./microvm-instances.ts";
import { IDLE_GC_AFTER_MS } from "../vm-runtime/runtime/idle-gc.ts";
import { pause, percentiles, type Percentiles } from "./stats.ts";

/** The launch and memory targets (p50/p95 ms, MiB per idle instance). */
export const launchTargets = { warmP50Ms: 150, burstP95Ms: 400, noWarmP50Ms: 600, idleMiB: 24 } as const;

/** Launches at once in a burst, idle instances read, and walls booted ahead for the second burst. */
const BURST = 10;
const IDLE_INSTANCES = 10;
const WARM_WALLS = 10;

/** A burst's RunMicrovm → first RPC: percentiles, and every launch's (ms, ascending). */
type Burst = Percentiles & { p95: number; ms: number[] };

export interface LaunchRows {
  /** 10 launches at once, the default pool (one wall booted ahead): each RunMicrovm → first RPC. */
  burst: Burst;
  /** The same with 10 walls booted ahead, and what those walls held before it (MiB in all). */
  burstWarm: Burst & { walls: number; wallsMiB: number };
  /** RunMicrovm → first RPC, one after another, no wall booted ahead (the service's defaults otherwise). */
  noWarm: Percentiles;
  /** The same with launch snapshots off: each a cold start (the idle instances' launches). */
  coldStart: Percentiles;
  idle: IdleMemory;
  idleCpu: IdleCpu;
}

/** Settling time before a memory reading: the pool's wall refilled, page cache writes done. */
const SETTLE_MS = 3_000;
/** Idle instances are read once their runtime's collection once idle has run. */
const IDLE_MS = IDLE_GC_AFTER_MS + SETTLE_MS;
/** The span over which the idle instances' CPU is read, once they are idle. */
const IDLE_CPU_MS = 5_000;

const p95 = (samples: number[]) => [...samples].sort((a, b) => a - b)[Math.ceil(0.95 * samples.length) - 1] ?? NaN;

async function burstOf(api: MicrovmClient): Promise<Burst> {
  const burst = await Promise.all(Array.from({ length: BURST }, () => launchAndCall(api)));
  await Promise.all(burst.map((vm) => terminate(api, vm.microvmId)));
  const ms = burst.map((vm) => Math.round(vm.firstRpcMs)).sort((a, b) => a - b);
  return { ...percentiles(ms), p95: Math.round(p95(ms)), ms };
}

/**
 * Launch snapshots off where a row names walls or cold starts: the host takes one of an image
 * whose cold starts are slow (the `sandbox` image's are over 1 s on 2 cores), and a launch
 * restored from it would stand in for the wall or the cold start.
 */
const noLaunchSnapshots = { MICROVM_LAUNCH_SNAPSHOTS: "0" };

/** The default pool's burst on `env`, then the rows of the services of their own. */
export async function measureLaunchRows(env: MicrovmEnvironment, launches: number): Promise<LaunchRows> {
  const burst = await burstOf(env.api);
  const noWarm = await withMicrovmEnvironment(
    { provider: "gvisor", maxInstances: 4, serviceEnv: { MICROVM_WARM_INSTANCES: "0" } },
    `${launches} launches one after another with no wall booted ahead`,
    async (service) => {
      const samples: number[] = [];
      for (let i = 0; i < launches; i++) {
        const vm = await launchAndCall(service.api);
        samples.push(vm.firstRpcMs);
        await terminate(service.api, vm.microvmId);
      }
      return percentiles(samples);
    },
  );
  const { idle, idleCpu, coldStart } = await withMicrovmEnvironment(
    {
      provider: "gvisor",
      maxInstances: IDLE_INSTANCES + 1,
      serviceEnv: { MICROVM_WARM_INSTANCES: "0", ...noLaunchSnapshots },
    },
    `${IDLE_INSTANCES} instances started cold one after another, then idle`,
    measureIdle,
  );
  const burstWarm = await withMicrovmEnvironment(
    {
      provider: "gvisor",
      maxInstances: BURST + WARM_WALLS,
      serviceEnv: { MICROVM_WARM_INSTANCES: String(WARM_WALLS), ...noLaunchSnapshots },
    },
    `${BURST} launches at once with ${WARM_WALLS} walls booted ahead`,
    async (warm) => {
      // The image bundled and cached by a launch of its own, as the default pool's burst finds it.
      const first = await launchAndCall(warm.api);
      await terminate(warm.api, first.microvmId);
      // Every one of them up (booted ahead at the background weight, they take what CPU is left).
      await wallReady(warm.microvmUrl, 120_000, WARM_WALLS);
      await pause(IDLE_MS);
      const walls = warmWallsMiB(warm.instances());
      return { ...(await burstOf(warm.api)), walls: walls.walls, wallsMiB: walls.MiB };
    },
  );
  return { burst, burstWarm, noWarm, coldStart, idle, idleCpu };
}

/** 10 instances launched one after another (their RunMicrovm → first RPC timed), read once idle, then terminated. */
async function measureIdle(
  env: MicrovmEnvironment,
): Promise<{ idle: IdleMemory; idleCpu: IdleCpu; coldStart: Percentiles }> {
  await pause(SETTLE_MS);
  const baseline = memoryBaseline(env.servicePid);
  const vms = [];
  for (let i = 0; i < IDLE_INSTANCES; i++) vms.push(await launchAndCall(env.api));
  await pause(IDLE_MS);
  const procs = env.instances();
  const idle = readIdleMemory(procs, env.servicePid, baseline);
  const idleCpu = await readIdleCpu(procs, IDLE_CPU_MS);
  for (const vm of vms) await terminate(env.api, vm.microvmId);
  return { idle, idleCpu, coldStart: percentiles(vms.map((vm) => vm.firstRpcMs)) };
}

/** RunMicrovm → first RPC one after another, each once the wall booted for the one before has settled. */
export async function measureWarmLaunches(env: MicrovmEnvironment, launches: number): Promise<Percentiles> {
  const samples: number[] = [];
  for (let i = 0; i < launches; i++) {
    await wallReady(env.microvmUrl);
    const vm = await launchAndCall(env.api);
    samples.push(vm.firstRpcMs);
    await terminate(env.api, vm.microvmId);
  }
  return percentiles(samples);
}

const verdict = (met: boolean) => (met ? "met" : "missed");

/** The rows and the verdicts; `warm` is the snapshot rows' RunMicrovm → first RPC (a wall waiting). */
export function formatLaunchRows(rows: LaunchRows, warm: Percentiles, wallWait?: Percentiles): string {
  const { burst, burstWarm, noWarm } = rows;
  return [
    "| RunMicrovm → first RPC | measured | target (idle machine) | verdict |",
    "| --- | --- | --- | --- |",
    `| a wall booted ahead, p50 (each launched once one was up${wallWait ? `; its refill after the last launch waited for p50 ${wallWait.p50.toFixed(0)} ms` : ""}) | ${warm.p50.toFixed(0)} ms | ≤ ${launchTargets.warmP50Ms} ms | ` +
      `${verdict(warm.p50 <= launchTargets.warmP50Ms)} |`,
    `| ${BURST} at once, p95 (p50 ${burst.p50.toFixed(0)} ms) | ${burst.p95} ms | ≤ ${launchTargets.burstP95Ms} ms | ` +
      `${verdict(burst.p95 <= launchTargets.burstP95Ms)} |`,
    `| ${BURST} at once, ${burstWarm.walls} walls booted ahead (MICROVM_WARM_INSTANCES=${WARM_WALLS}, ` +
      `launch snapshots off), p95 ` +
      `(p50 ${burstWarm.p50.toFixed(0)} ms) | ${burstWarm.p95} ms | ≤ ${launchTargets.burstP95Ms} ms | ` +
      `${verdict(burstWarm.p95 <= launchTargets.burstP95Ms)} |`,
    `| no wall booted ahead, p50 (after the first, restored from the image's launch snapshot) | ` +
      `${noWarm.p50.toFixed(0)} ms | ≤ ${launchTargets.noWarmP50Ms} ms | ${verdict(noWarm.p50 <= launchTargets.noWarmP50Ms)} |`,
    `| information only: no wall booted ahead, launch snapshots off (every launch a cold start), p50 | ` +
      `${rows.coldStart.p50.toFixed(0)} ms | | |`,
    "",
    `the ${burstWarm.walls} walls booted ahead held ${burstWarm.wallsMiB} MiB ` +
      `(${(burstWarm.wallsMiB / Math.max(1, burstWarm.walls)).toFixed(1)} MiB each, their cgroups' charge) before that burst`,
    "",
    formatIdleMemory(rows.idle),
    "",
    formatIdleCpu(rows.idleCpu),
  ].join("\n");
}

function formatIdleCpu(cpu: IdleCpu): string {
  return (
    `CPU per idle instance (${cpu.spanMs / 1000} s, medians): ${cpu.perInstance} ms/s, of it the Sentry ` +
    `(runsc-sandbox: node inside and gVisor's own work) ${cpu.sentry} ms/s; at that rate ${cpu.fillsCores} ` +
    `idle instances take all ${cpu.cores} cores of this machine`
  );
}

function formatIdleMemory(idle: IdleMemory): string {
  const { cgroup, outside, capacity } = idle;
  return [
    `| memory per idle instance (${idle.instances} idle, started cold, medians) | MiB | target (idle machine) | verdict |`,
    "| --- | --- | --- | --- |",
    `| its cgroup's charge + its processes outside it + the service's growth | ${idle.perInstanceMiB} | ` +
      `≤ ${launchTargets.idleMiB} | ${verdict(idle.perInstanceMiB <= launchTargets.idleMiB)} |`,
    `| of it: cgroup charge | ${cgroup.charge} | | |`,
    `| of the charge: the Sentry's memory file (node's heap, malloc, stacks) | ${cgroup.memoryFile} | | |`,
    `| of the charge: runsc run, gofer and Sentry's own memory (Go) | ${cgroup.runsc} | | |`,
    `| of the charge: kernel memory (page tables, sockets) | ${cgroup.kernel} | | |`,
    `| of the charge: page cache it read first | ${cgroup.pageCache} | | |`,
    `| of it: processes outside its cgroup (${outside.processes} in all) | ${outside.MiB} | | |`,
    `| of it: the service's growth (PSS) | ${idle.serviceMiB} | | |`,
    `| information only: the machine's used memory (MemTotal - MemAvailable) | ${idle.machineMiB} | ` +
      "| page cache freed or filled elsewhere moves it |",
    "",
    `idle instances held: one host with the default caps, min(MICROVM_MAX_INSTANCES ${capacity.maxInstances}, ` +
      `MICROVM_TOTAL_MEMORY_MIB ${capacity.totalMemoryMiB} / ${cgroup.charge} MiB charged) = ${capacity.host}; ` +
      `this machine (${capacity.machineMiB} MiB) with both caps raised: ${capacity.machine}`,
  ].join("\n");
}

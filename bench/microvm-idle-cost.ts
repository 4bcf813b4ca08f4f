// What an idle gVisor instance costs the machine and how long its start takes, on the provider
// alone (no service): N instances of the `sandbox` image started one after another, then idle;
// the machine's MemTotal - MemAvailable per instance, each part's PSS (runsc run, gofer, Sentry,
// its stub processes) and its cgroup's charge; and provider.start → first answer with a warm
// wall waiting, without one, and 10 at once, against `runsc do /bin/true` (a bare sandbox)
// sampled between them, as ratios to it.
// Run: npx tsx bench/microvm-idle-cost.ts [instances] [rounds]
import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  builtinImages,
  checkGvisor,
  createGvisorProvider,
  findRunsc,
  type IsolatedProvider,
} from "../vm-runtime/service/index.ts";
import { pssKiB, roleOf, usedKiB } from "./gvisor-parts.ts";
import { IDLE_GC_AFTER_MS } from "../vm-runtime/runtime/idle-gc.ts";
import { percentiles, pause } from "./stats.ts";

const MiB = 1024 * 1024;

/** PSS by role summed over every instance's cgroup, and the cgroups' charge, MiB per instance. */
function parts(provider: IsolatedProvider): Record<string, number> {
  const live = provider.live();
  const sums: Record<string, number> = {};
  let charged = 0;
  for (const handle of live) {
    const group = provider.cgroupOf(handle)!;
    charged += group.memoryBytes();
    for (const pid of group.pids()) {
      const role = roleOf(pid);
      sums[role] = (sums[role] ?? 0) + pssKiB(pid) / 1024;
    }
  }
  const each = Object.fromEntries(Object.entries(sums).map(([role, mib]) => [role, +(mib / live.length).toFixed(1)]));
  return { ...each, cgroupCharged: +(charged / live.length / MiB).toFixed(1) };
}

async function startAndAnswer(provider: IsolatedProvider, id: string): Promise<number> {
  const began = performance.now();
  await provider.start({ microvmId: id, image: builtinImages.sandbox });
  return performance.now() - began;
}

/** `runsc do /bin/true`: a bare sandbox around a process that exits at once, ms. */
async function bareRunsc(stateDir: string): Promise<number> {
  const began = performance.now();
  await promisify(execFile)(findRunsc()!, [
    `--root=${stateDir}`,
    "--network=none",
    "--platform=systrap",
    "--ignore-cgroups",
    "do",
    "/bin/true",
  ]);
  return performance.now() - began;
}

const ratio = (samples: number[], baseline: number[]) =>
  +(percentiles(samples).p50 / percentiles(baseline).p50).toFixed(2);

async function main(): Promise<void> {
  const instances = Number(process.argv[2] ?? 10);
  const rounds = Number(process.argv[3] ?? 5);
  const check = await checkGvisor();
  if (!check.ok) throw new Error(check.reason);
  const hostKey = `idle-cost-${process.pid}`;
  // Density: no warm wall, so only the instances are counted.
  const cold = await createGvisorProvider({ hostKey: `${hostKey}-cold`, warmInstances: 0 });
  const warm = await createGvisorProvider({ hostKey: `${hostKey}-warm`, warmInstances: 1 });
  try {
    await cold.prepare([builtinImages.sandbox]);
    await warm.prepare([builtinImages.sandbox]);
    await startAndAnswer(cold, "first").then(() => cold.terminate(cold.live()[0]!));
    const times = { warm: [] as number[], cold: [] as number[], bare: [] as number[] };
    const stateDir = await mkdtemp(join(tmpdir(), "bare-runsc-"));
    for (let round = 0; round < rounds; round++) {
      times.bare.push(await bareRunsc(stateDir));
      // A warm wall is waiting: the pool refilled (its runtime printed its boot line) before each.
      await pause(1_500);
      times.warm.push(await startAndAnswer(warm, `warm-${round}`));
      times.cold.push(await startAndAnswer(cold, `cold-${round}`));
      for (const handle of [...warm.live(), ...cold.live()])
        await (warm.live().includes(handle) ? warm : cold).terminate(handle);
    }
    await rm(stateDir, { recursive: true, force: true });
    console.log("runsc do /bin/true:", percentiles(times.bare));
    console.log("start → answering, warm wall:", percentiles(times.warm), "ratio", ratio(times.warm, times.bare));
    console.log("start → answering, no warm wall:", percentiles(times.cold), "ratio", ratio(times.cold, times.bare));
    const burst = await Promise.all(Array.from({ length: 10 }, (_, i) => startAndAnswer(cold, `burst-${i}`)));
    console.log("10 at once, no warm wall:", percentiles(burst), "ratio", ratio(burst, times.bare));
    await Promise.all(cold.live().map((handle) => cold.terminate(handle)));
    await pause(2_000);
    const before = usedKiB();
    for (let i = 0; i < instances; i++) await startAndAnswer(cold, `idle-${i}`);
    // Past the runtime's collection once idle.
    await pause(IDLE_GC_AFTER_MS + 5_000);
    const after = usedKiB();
    const eachMiB = (after - before) / 1024 / instances;
    const measured = parts(cold);
    const totalMiB = Number(/^MemTotal:\s+(\d+)/m.exec(readFileSync("/proc/meminfo", "utf8"))?.[1]) / 1024;
    console.log(`${instances} idle: machine ${eachMiB.toFixed(1)} MiB each (noisy on a shared machine)`, measured);
    // Each instance's cgroup is charged its processes' own memory and the Sentry's memory file:
    // the machine's estimate, beside the host-wide cap (half of it by default).
    console.log(
      `room for about ${Math.floor(totalMiB / measured.cgroupCharged!)} idle instances in the machine's memory, ` +
        `${Math.floor(totalMiB / 2 / measured.cgroupCharged!)} under the default host-wide cap`,
    );
  } finally {
    await cold.close();
    await warm.close();
  }
}

await main();

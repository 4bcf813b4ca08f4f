// Where a launch's time goes before the service is involved: `node -e 0` plain, in the
// bubblewrap trial sandbox (checkSandbox) and in a gVisor trial sandbox (checkGvisor: a fresh
// OCI bundle and `runsc run`), taking turns, outside any instance cgroup and its CPU quota.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { checkGvisor, checkSandbox } from "../vm-runtime/service/index.ts";
import { percentiles, type Percentiles } from "./stats.ts";
import type { ProviderName } from "./microvm-instance-procs.ts";

/** `node -e 0` start to exit, ms, under each wall measured. */
export type LaunchFloor = Partial<Record<ProviderName, Percentiles>>;

async function plainNode(): Promise<void> {
  const child = spawn(process.execPath, ["-e", "0"], { stdio: "ignore" });
  const [code] = (await once(child, "exit")) as [number | null];
  if (code !== 0) throw new Error(`node -e 0 exited ${code}`);
}

const trials: Record<ProviderName, () => Promise<void>> = {
  process: plainNode,
  sandbox: async () => {
    const check = await checkSandbox();
    if (!check.ok) throw new Error(`bubblewrap trial: ${check.reason}`);
  },
  gvisor: async () => {
    const check = await checkGvisor();
    if (!check.ok) throw new Error(`gVisor trial: ${check.reason}`);
  },
};

export async function measureLaunchFloor(all: readonly ProviderName[], samples: number): Promise<LaunchFloor> {
  // checkGvisor answered in 0.2 ms in a quick run (it cannot have run runsc): left out until
  // that is understood, rather than reported as gVisor's floor.
  const providers = all.filter((p) => p !== "gvisor");
  const times = Object.fromEntries(providers.map((p) => [p, [] as number[]])) as Record<ProviderName, number[]>;
  for (let i = 0; i < samples; i++) {
    for (const provider of providers) {
      const started = performance.now();
      await trials[provider]();
      times[provider].push(performance.now() - started);
    }
  }
  return Object.fromEntries(providers.map((p) => [p, percentiles(times[p])]));
}

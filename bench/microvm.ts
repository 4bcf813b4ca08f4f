// `npm run bench -- --microvm`: the microVM facility of the service (process provider, the
// `sandbox` image) measured against its targets: launch → first RPC, RPC through the proxy,
// suspend/resume, memory per live instance and how latency changes with 1, 10, 50 instances.
// Every instance is terminated and every child stopped, also on error and Ctrl-C.
import { openBuckets } from "../platform/index.ts";
import { installShutdownHandlers } from "./environment.ts";
import { measureDensity, type DensityPoint, type DensitySettings } from "./microvm-density.ts";
import { directRuntimes } from "./microvm-direct.ts";
import { leftoverInstances, startMicrovmEnvironment, type MicrovmEnvironment } from "./microvm-environment.ts";
import { launchAndCall, launchedIds, terminate } from "./microvm-instances.ts";
import { sequential, stubCall } from "./microvm-http.ts";
import { measureLaunches, measureSuspendResume } from "./microvm-lifecycle.ts";
import { formatDensity, formatLatencies, formatRpcPaths, latencyRows, targets } from "./microvm-report.ts";
import { measureDirect, measureHostProxy, type RpcSettings } from "./microvm-rpc.ts";
import type { BenchOptions } from "./options.ts";
import { writeResults } from "./results.ts";

export interface MicrovmSettings {
  /** Sequential launches per launch path. */
  launches: number;
  rpc: RpcSettings;
  /** Suspend/resume cycles (and as many auto-resumes). */
  cycles: number;
  density: DensitySettings;
}

export function microvmSettings(options: BenchOptions): MicrovmSettings {
  if (options.quick) {
    return {
      launches: 5,
      rpc: { calls: 500, callers: 20, seconds: 1 },
      cycles: 5,
      density: { levels: [1, 10], rpcCalls: 300, extraLaunches: 3, fillConcurrency: 4 },
    };
  }
  return {
    launches: 20,
    rpc: { calls: 2_000, callers: 20, seconds: 3 },
    cycles: 20,
    density: { levels: [1, 10, 50], rpcCalls: 1_000, extraLaunches: 5, fillConcurrency: 4 },
  };
}

export async function runMicrovmBench(options: BenchOptions, header: Record<string, unknown>, startedAt: Date): Promise<void> {
  const settings = microvmSettings(options);
  let env: MicrovmEnvironment | undefined;
  let direct: Awaited<ReturnType<typeof directRuntimes>> | undefined;
  let cleaning: Promise<void> | undefined;
  // Once, whether the run ends, fails or is interrupted (Ctrl-C may land mid-cleanup).
  const cleanUp = () =>
    (cleaning ??= (async () => {
      await direct?.close();
      await env?.close();
      // This run's directories only: another bench running beside this one keeps its instances.
      await assertNoInstanceLeft([env?.dataDir, direct?.workDir].filter((dir): dir is string => dir !== undefined));
    })());
  installShutdownHandlers(cleanUp);
  // Room for the densest level plus the launches measured at that level.
  const maxInstances = Math.max(...settings.density.levels) + 10;
  env = await startMicrovmEnvironment({ maxInstances, ...(options.cpuProf ? { cpuProfDir: options.cpuProf } : {}) });
  console.log(`service pid ${env.servicePid} (all roles, MICROVM_MAX_INSTANCES=${maxInstances}, DATA_DIR ${env.dataDir}), nats-server pid ${env.natsPid}`);
  let results: Record<string, unknown> | undefined;
  try {
    results = await measureAll(env, (direct = await directRuntimes()), settings);
  } finally {
    await cleanUp();
  }
  const file = await writeResults({ ...header, settings, targets, ...results }, startedAt, "microvm");
  console.log(`results: ${file}`);
}

/** Every instance process of this run (host-started or by hand) must be gone; any left is killed. */
async function assertNoInstanceLeft(markers: string[]): Promise<void> {
  const left = await leftoverInstances(markers);
  for (const { pid } of left) process.kill(pid, "SIGKILL");
  if (left.length) throw new Error(`instance processes left after the bench (killed now): ${left.map((p) => `${p.pid} ${p.cmdline}`).join("; ")}`);
  console.log(`\ncleanup: ${launchedIds.size} instances launched, all terminated; no instance process left`);
}

async function measureAll(env: MicrovmEnvironment, direct: Awaited<ReturnType<typeof directRuntimes>>, settings: MicrovmSettings) {
  const { microvms: kv } = await openBuckets(env.nc);
  console.log(`\nlaunches: ${settings.launches} sequential per path, each terminated…`);
  const launches = await measureLaunches(env.api, kv, settings.launches);

  console.log(`RPC: ${settings.rpc.calls} sequential calls and ${settings.rpc.seconds} s × ${settings.rpc.callers} callers per path…`);
  const vm = await launchAndCall(env.api);
  const instancePid = env.instancePids()[0]!;
  const getMicrovm = await sequential(stubCall(() => env.api.getMicrovm({ microvmIdentifier: vm.microvmId })), 500);
  const runtime = await direct.start();
  const rpc = [
    ...(await measureHostProxy(vm, { service: env.servicePid, instance: instancePid }, settings.rpc)),
    ...(await measureDirect(runtime, settings.rpc)),
  ];
  await runtime.stop();

  console.log(`suspend/resume: ${settings.cycles} cycles by the operations, ${settings.cycles} auto-resumes…`);
  const suspend = await measureSuspendResume(env.api, vm, settings.cycles);
  await terminate(env.api, vm.microvmId);

  console.log(`density: ${settings.density.levels.join(", ")} live instances…`);
  const density = await measureDensity(env, settings.density, (p: DensityPoint) =>
    console.log(`  ${p.live} live: ${p.perInstance.rss} MiB VmRSS per instance (PSS ${p.perInstance.pss}), service ${p.serviceMiB.rss} MiB, RPC p50 ${p.rpc.p50} ms, Run→RUNNING p50 ${p.running.p50} ms`),
  );
  const deaths = env.deaths();

  console.log(`\nmicroVM latencies (process provider, sandbox image; p50 against the target):\n`);
  console.log(formatLatencies(latencyRows(launches, rpc, suspend, getMicrovm)));
  console.log(`\nRPC paths (hello("x"); sequential after 100 unmeasured, then ${settings.rpc.callers} concurrent callers for ${settings.rpc.seconds} s):\n`);
  console.log(formatRpcPaths(rpc));
  console.log(`\ndensity (live instances have each answered one RPC; memory read 1 s after the last launch):\n`);
  console.log(formatDensity(density));
  if (deaths.length) console.log(`\nprocesses that died during the run: ${deaths.join("; ")}`);
  return { launches, getMicrovm, rpc, suspend, density, deaths };
}

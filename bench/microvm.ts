// `npm run bench -- --microvm`: the microVM facility of the service (the `sandbox` image)
// under every provider in the same run (process, sandbox, and gvisor where runsc runs), each
// behind a service of its own: launch → first RPC, RPC through the proxy, suspend/resume, image
// push, memory per live instance and how latency changes with 1, 10, 50 instances; then each
// wall's cost as ratios (sandbox / process, gvisor / sandbox) against the issues' targets; and on
// gvisor its snapshots, suspend/resume and launch from a snapshot vs cold start.
// Every instance is terminated and every child stopped, also on error and Ctrl-C.
import { loadavg } from "node:os";
import { openBuckets } from "../platform/index.ts";
import { cleanUpOnInterrupt } from "./children.ts";
import { checkGvisor, checkSandbox } from "../vm-runtime/service/index.ts";
import { comparisonRows, gvisorTargets, sandboxTargets, verdicts, type ProviderResults } from "./microvm-compare.ts";
import { measureDensity, type DensityPoint, type DensitySettings } from "./microvm-density.ts";
import { directRuntimes } from "./microvm-direct.ts";
import {
  cleanUpRun,
  startMicrovmEnvironment,
  withMicrovmEnvironment,
  type MicrovmEnvironment,
} from "./microvm-environment.ts";
import type { ProviderName } from "./microvm-instance-procs.ts";
import { launchAndCall, terminate, type Connected } from "./microvm-instances.ts";
import { sequential, stubCall } from "./microvm-http.ts";
import { measureLaunchFloor } from "./microvm-launch-floor.ts";
import { launchSampler, measureSuspendResume, type LaunchResults } from "./microvm-lifecycle.ts";
import { targets } from "./microvm-report.ts";
import { measureDirect, measureHostProxy, type RpcPath, type RpcSettings } from "./microvm-rpc.ts";
import { formatImages, imageTargets, measureImages, type ImageResults } from "./microvm-images.ts";
import { formatSnapshots, measureSnapshots, type SnapshotSettings } from "./microvm-snapshots.ts";
import { formatLaunchRows, launchTargets, measureLaunchRows, measureWarmLaunches } from "./microvm-launch-rows.ts";
import { formatObjectRows, measureObjects, objectTargets } from "./microvm-objects.ts";
import { formatLaunchFromSnapshot, measureLaunchFromSnapshot } from "./microvm-launch-snapshots.ts";
import { printProviderResults } from "./microvm-summary.ts";
import type { BenchOptions, BenchRun } from "./options.ts";
import { saveResults } from "./results.ts";

export interface MicrovmSettings {
  /** Sequential launches per launch path. */
  launches: number;
  rpc: RpcSettings;
  /** Suspend/resume cycles (and as many auto-resumes). */
  cycles: number;
  density: DensitySettings;
  /** Images pushed and launched uncached then cached, per provider. */
  images: number;
  /** `node -e 0` under each wall's trial sandbox, per provider. */
  floorSamples: number;
  /** gVisor's snapshots: cycles against cold launches, and instances suspended together. */
  snapshots: SnapshotSettings;
}

/**
 * The baseline first, each wall after the one it is compared with (sandbox / process, gvisor /
 * sandbox); gvisor only where a trial runsc sandbox runs (else said, and its targets "not measured").
 */
async function providersHere(): Promise<ProviderName[]> {
  const sandbox = await checkSandbox();
  // Every comparison is against the sandbox: without it there is nothing to compare.
  if (!sandbox.ok) throw new Error(`the bubblewrap sandbox cannot run here: ${sandbox.reason}`);
  const gvisor = await checkGvisor();
  if (!gvisor.ok) console.log(`gvisor: not measured in this run: ${gvisor.reason}`);
  return gvisor.ok ? ["process", "sandbox", "gvisor"] : ["process", "sandbox"];
}

export function microvmSettings(options: BenchOptions): MicrovmSettings {
  if (options.quick) {
    return {
      launches: 5,
      rpc: { calls: 500, callers: 20, seconds: 1 },
      cycles: 5,
      density: { levels: [1, 10], rpcCalls: 300, extraLaunches: 3, fillConcurrency: 4 },
      images: 3,
      floorSamples: 3,
      snapshots: { samples: 5, suspended: 50, concurrency: 4 },
    };
  }
  return {
    launches: 20,
    rpc: { calls: 2_000, callers: 20, seconds: 3 },
    cycles: 20,
    density: { levels: [1, 10, 50], rpcCalls: 1_000, extraLaunches: 5, fillConcurrency: 4 },
    images: 9,
    floorSamples: 7,
    snapshots: { samples: 10, suspended: 50, concurrency: 4 },
  };
}

type Envs = Partial<Record<ProviderName, MicrovmEnvironment>>;

export const runMicrovmBench: BenchRun = async (options, header, startedAt) => {
  const settings = microvmSettings(options);
  const providers = await providersHere();
  const envs: Envs = {};
  let direct: Awaited<ReturnType<typeof directRuntimes>> | undefined;
  // Once, whether the run ends, fails or is interrupted (Ctrl-C may land mid-cleanup).
  const cleanUp = cleanUpOnInterrupt(() => cleanUpRun(Object.values(envs), direct));
  // Room for the densest level plus the launches measured at that level, and for the
  // instances gVisor's snapshot rows suspend together (50 also in a --quick run).
  const snapshotted = providers.includes("gvisor") ? settings.snapshots.suspended : 0;
  const maxInstances = Math.max(...settings.density.levels, snapshotted) + 10;
  let results: Record<string, unknown> | undefined;
  try {
    for (const provider of providers) {
      const env = (envs[provider] = await startMicrovmEnvironment({
        provider,
        maxInstances,
        ...(options.cpuProf ? { cpuProfDir: options.cpuProf } : {}),
        ...(provider === "gvisor" ? { serviceEnv: snapshotServiceEnv } : {}),
      }));
      console.log(
        `${provider}: service pid ${env.servicePid} (all roles, MICROVM_PROVIDER=${provider}, ` +
          `MICROVM_HOST_ID=${env.hostId}, MICROVM_MAX_INSTANCES=${maxInstances}, DATA_DIR ${env.dataDir}), ` +
          `nats-server pid ${env.natsPid}`,
      );
    }
    results = await measureAll(
      providers,
      envs as Record<ProviderName, MicrovmEnvironment>,
      (direct = await directRuntimes()),
      settings,
    );
  } catch (err) {
    // The measurement's failure is the one to report; a cleanup failure after it is logged.
    await cleanUp().catch((cleanupErr: unknown) =>
      console.error(`cleanup after the failure: ${(cleanupErr as Error).message}`),
    );
    throw err;
  }
  await cleanUp();
  await saveResults(
    { ...header, settings, targets, sandboxTargets, gvisorTargets, imageTargets, ...results },
    startedAt,
    "microvm",
    "",
  );
};

/** Room in one principal's snapshot quota for every instance the snapshot rows suspend at once. */
const snapshotServiceEnv = { MICROVM_SNAPSHOT_QUOTA_MIB: "2048", MICROVM_SNAPSHOT_STORE_MIB: "4096" };

/** `--microvm-snapshots`: the snapshot rows only, on one gvisor-provider service. */
export const runSnapshotBench: BenchRun = async (options, header, startedAt) => {
  const gvisor = await checkGvisor();
  if (!gvisor.ok) throw new Error(`gvisor cannot run here: ${gvisor.reason}`);
  const settings = microvmSettings(options).snapshots;
  const { snapshots, launchFromSnapshot } = await withMicrovmEnvironment(
    { provider: "gvisor", maxInstances: settings.suspended + 10, serviceEnv: snapshotServiceEnv },
    `${settings.samples} cold launches and suspend/resume cycles taking turns, then ${settings.suspended} ` +
      `instances suspended together, then launch from snapshot vs cold start`,
    async (env) => ({
      snapshots: await measureSnapshots(env, settings),
      launchFromSnapshot: await measureLaunchFromSnapshot(env, settings.samples),
    }),
  );
  console.log(`\nsnapshots on the gvisor provider (sandbox image):\n\n${formatSnapshots(snapshots)}`);
  console.log(`\n${formatLaunchFromSnapshot(launchFromSnapshot)}`);
  await saveResults({ ...header, settings, snapshots, launchFromSnapshot }, startedAt, "microvm-snapshots", "");
};

/** What suspend and resume are held to (issue 52), on an idle machine: p50 in ms. */
export const snapshotTargets = { suspendMs: 300, resumeFirstRpcMs: 300 } as const;

/**
 * The microVM rows of the default run: gVisor's snapshot cycles against cold launches beside
 * them (10; --quick 5) and 10 instances suspended together, with the targets' verdicts. Skipped,
 * saying why, where gVisor cannot run.
 */
export async function runDefaultMicrovmRows(options: BenchOptions, header: object, startedAt: Date): Promise<void> {
  const gvisor = await checkGvisor();
  if (!gvisor.ok) {
    console.log(`
microVM rows skipped: gvisor cannot run here (${gvisor.reason})`);
    return;
  }
  const settings: SnapshotSettings = { samples: options.quick ? 5 : 10, suspended: 10, concurrency: 4 };
  const load = loadavg();
  console.log("");
  const { snapshots, launches, objects } = await withMicrovmEnvironment(
    // The object rows' one principal holds 31 objects active at once (a called one, the cold
    // activations, the alarm objects): past a principal's default share of a host (10).
    {
      provider: "gvisor",
      maxInstances: settings.suspended + 10,
      serviceEnv: { ...snapshotServiceEnv, MICROVM_OBJECTS_PER_PRINCIPAL: "50" },
    },
    `the microVM rows: ${settings.samples} cold launches and suspend/resume cycles taking turns, then ` +
      `${settings.suspended} instances suspended together, 10 launches at once`,
    async (env) => ({
      snapshots: await measureSnapshots(env, settings),
      launches: await measureLaunchRows(env, settings.samples),
      objects: await measureObjects(env, settings.samples),
    }),
  );
  const verdict = (name: string, p50: number, target: number) =>
    `| ${name} | ${p50.toFixed(0)} ms | ≤ ${target} ms | ${p50 <= target ? "met" : "missed"} |`;
  console.log(`
snapshots on the gvisor provider (sandbox image):\n\n${formatSnapshots(snapshots)}`);
  console.log(
    [
      "\n| target (idle machine) | p50 | target | verdict |",
      "| --- | --- | --- | --- |",
      verdict("SuspendMicrovm → SUSPENDED", snapshots.suspend.p50, snapshotTargets.suspendMs),
      verdict("ResumeMicrovm → first RPC (own image)", snapshots.resumeFirstRpc.p50, snapshotTargets.resumeFirstRpcMs),
      `\nload average before these rows ${load.map((n) => n.toFixed(2)).join(" ")}: the targets are for an idle machine`,
    ].join("\n"),
  );
  console.log(
    `\nlaunches and memory on the gvisor provider (sandbox image):\n\n${formatLaunchRows(launches, snapshots.coldFirstRpc, snapshots.wallWaitMs)}`,
  );
  console.log(`\nobjects on the gvisor provider:\n\n${formatObjectRows(objects)}`);
  await saveResults(
    { ...header, settings, snapshots, snapshotTargets, launches, launchTargets, objects, objectTargets },
    startedAt,
    "microvm-default",
    "",
  );
}

/**
 * `--microvm-launches`: the default run's launch and memory rows alone, its "a wall booted ahead"
 * row from launches of their own (one after another, each with the wall booted behind the last).
 */
export const runLaunchBench: BenchRun = async (options, header, startedAt) => {
  const gvisor = await checkGvisor();
  if (!gvisor.ok) throw new Error(`gvisor cannot run here: ${gvisor.reason}`);
  const samples = options.quick ? 5 : 10;
  const load = loadavg();
  const { warm, launches } = await withMicrovmEnvironment(
    { provider: "gvisor", maxInstances: 20 },
    `${samples} launches with a wall booted ahead, then 10 launches at once`,
    async (env) => ({
      warm: await measureWarmLaunches(env, samples),
      launches: await measureLaunchRows(env, samples),
    }),
  );
  console.log(
    `
launches and memory on the gvisor provider (sandbox image; load average before ` +
      `${load.map((n) => n.toFixed(2)).join(" ")}):

${formatLaunchRows(launches, warm)}`,
  );
  await saveResults({ ...header, samples, warm, launches, launchTargets }, startedAt, "microvm-launches", "");
};

/** `--microvm-images`: the image rows only, on one sandbox-provider service. */
export const runImageBench: BenchRun = async (options, header, startedAt) => {
  const samples = microvmSettings(options).images;
  const images = await withMicrovmEnvironment(
    { provider: "sandbox", maxInstances: 10 },
    `${samples} images, each pushed, launched uncached, then cached`,
    (env) => measureImages(env, samples),
  );
  console.log(`\nimages on the sandbox provider (targets from issue 13):\n\n${formatImages(images)}`);
  await saveResults({ ...header, samples, imageTargets, images }, startedAt, "microvm-images", "");
};

/**
 * Phase by phase, the providers taking turns (launch by launch in the launch phase) so drift
 * on the machine hits all alike; then the density of one provider after the other (its live
 * instances would weigh on the others' figures).
 */
async function measureAll(
  providers: readonly ProviderName[],
  envs: Record<ProviderName, MicrovmEnvironment>,
  direct: Awaited<ReturnType<typeof directRuntimes>>,
  settings: MicrovmSettings,
) {
  console.log(
    `\nlaunches: ${settings.launches} sequential per path and provider, each terminated, providers taking turns…`,
  );
  const samplers = {} as Record<ProviderName, ReturnType<typeof launchSampler>>;
  for (const provider of providers) {
    samplers[provider] = launchSampler(envs[provider].api, (await openBuckets(envs[provider].nc)).microvms);
    await samplers[provider].cold();
  }
  for (let i = 0; i < settings.launches; i++) {
    for (const provider of providers) await samplers[provider].step();
  }
  const launches = {} as Record<ProviderName, LaunchResults>;
  for (const provider of providers) {
    launches[provider] = samplers[provider].results();
    console.log(`  ${provider}: RunMicrovm → first RPC p50 ${launches[provider].firstRpc.p50} ms`);
  }
  console.log(`launch floor: node -e 0 in each wall's trial sandbox, ${settings.floorSamples} times, taking turns…`);
  const floor = await measureLaunchFloor(providers, settings.floorSamples);

  console.log(
    `RPC: ${settings.rpc.calls} sequential calls and ${settings.rpc.seconds} s × ${settings.rpc.callers} callers ` +
      `per path…`,
  );
  const vms = {} as Record<ProviderName, Connected>;
  const proxied = {} as Record<ProviderName, { getMicrovm: ProviderResults["getMicrovm"]; rpc: RpcPath[] }>;
  for (const provider of providers) {
    const env = envs[provider];
    const vm = (vms[provider] = await launchAndCall(env.api));
    const instance = env.instances()[0];
    if (!instance) throw new Error(`${provider}: no instance process found under the service (pid ${env.servicePid})`);
    const getMicrovm = await sequential(
      stubCall(() => env.api.getMicrovm({ microvmIdentifier: vm.microvmId })),
      500,
    );
    proxied[provider] = {
      getMicrovm,
      rpc: await measureHostProxy(vm, { service: env.servicePid, instance: instance.pids }, settings.rpc),
    };
  }
  const runtime = await direct.start();
  const directPaths = await measureDirect(runtime, settings.rpc);
  await runtime.stop();

  console.log(`suspend/resume: ${settings.cycles} cycles by the operations, ${settings.cycles} auto-resumes…`);
  const results = {} as Record<ProviderName, ProviderResults>;
  const suspends = {} as Record<ProviderName, ProviderResults["suspend"]>;
  for (const provider of providers) {
    suspends[provider] = await measureSuspendResume(envs[provider].api, vms[provider], settings.cycles);
    await terminate(envs[provider].api, vms[provider].microvmId);
  }
  const { snapshots: snapshotSettings } = settings;
  if (envs.gvisor)
    console.log(
      `snapshots (gvisor): ${snapshotSettings.samples} cold launches and suspend/resume cycles taking turns, then ` +
        `${snapshotSettings.suspended} instances suspended together…`,
    );
  const snapshots = envs.gvisor ? await measureSnapshots(envs.gvisor, snapshotSettings) : undefined;
  if (envs.gvisor) console.log("launch from snapshot vs cold start (gvisor): a slow-importing image…");
  const launchFromSnapshot = envs.gvisor
    ? await measureLaunchFromSnapshot(envs.gvisor, snapshotSettings.samples)
    : undefined;

  console.log(
    `images: ${settings.images} pushed per provider (checked in an instance), each launched uncached then cached…`,
  );
  const images = {} as Record<ProviderName, ImageResults>;
  for (const provider of providers) {
    images[provider] = await measureImages(envs[provider], settings.images);
    console.log(`  ${provider}: createImage → registered p50 ${images[provider].registration.p50.toFixed(0)} ms`);
  }

  for (const provider of providers) {
    console.log(`density (${provider}): ${settings.density.levels.join(", ")} live instances…`);
    const failures: string[] = [];
    const density = await measureDensity(
      envs[provider],
      settings.density,
      (p: DensityPoint) =>
        console.log(
          `  ${p.live} live: ${p.perInstance.pss} MiB PSS per instance (VmRSS ` +
            `${p.perInstance.rss}${p.cgroupPerInstance ? `, cgroup ${p.cgroupPerInstance.usage}` : ""}), ` +
            `service ${p.serviceMiB.rss} MiB, RPC p50 ${p.rpc.p50} ms, Run→RUNNING p50 ${p.running.p50} ms`,
        ),
      failures,
    );
    for (const failure of failures) console.log(`  ${provider}: DENSITY FAILED: ${failure}`);
    results[provider] = {
      launches: launches[provider],
      ...proxied[provider],
      suspend: suspends[provider],
      images: images[provider],
      launchFloor: floor[provider] ?? { n: 0, p50: NaN, p99: NaN, mean: NaN },
      density,
      deaths: envs[provider].deaths(),
      densityFailures: failures,
    };
  }

  const comparison = comparisonRows(results);
  printProviderResults(providers, results, directPaths, settings.rpc, comparison);
  if (snapshots) console.log(`\n## gvisor snapshots (sandbox image)\n\n${formatSnapshots(snapshots)}`);
  if (launchFromSnapshot) console.log(`\n## gvisor ${formatLaunchFromSnapshot(launchFromSnapshot)}`);
  return {
    providers: results,
    direct: directPaths,
    comparison,
    verdicts: verdicts(comparison),
    snapshots,
    launchFromSnapshot,
  };
}

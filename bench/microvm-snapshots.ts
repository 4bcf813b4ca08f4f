// Snapshots in the microVM bench (gVisor, the `sandbox` image): SuspendMicrovm (answered once
// the snapshot is stored), ResumeMicrovm → first RPC on the host that suspended it (from its own
// image) and from the store's copy (as another host would), a request to a SUSPENDED instance
// (auto-resume), the bytes stored per instance, against cold RunMicrovm → first RPC measured
// between them (each also as its ratio to that cycle's cold launch: load on the machine hits
// both alike); then what N SUSPENDED instances hold on the host (instance processes, their
// memory and cgroups, the service's RSS, records and snapshots) against the same ones RUNNING.
import { rm } from "node:fs/promises";
import { basename, join } from "node:path";
import { openBuckets } from "../platform/index.ts";
import { idKey } from "../schemas/index.ts";
import { WARM_PREFIX } from "../vm-runtime/host/isolated-boot.ts";
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { percentiles, type Percentiles, pause } from "./stats.ts";
import { expectHello, launchAndCall, terminate, wallReady, type Connected } from "./microvm-instances.ts";
import { hostCgroupKey, hostWorkDir } from "../vm-runtime/service/index.ts";
import { LOCAL_SNAPSHOTS_DIR } from "../vm-runtime/snapshots/keeper.ts";
import { cgroupMemoryKiB, pidsInHostGroup } from "./microvm-instance-procs.ts";
import { memoryKiB, memoryOf } from "./proc.ts";

export interface SnapshotSettings {
  /** Cold launches, and as many suspend/resume cycles, taking turns. */
  samples: number;
  /** Instances suspended together for the memory rows. */
  suspended: number;
  /** Launches in flight while filling (not measured); suspends go one at a time. */
  concurrency: number;
}

/**
 * What the host holds for a set of instances at one moment (MiB, one decimal): instances only,
 * not the walls the host boots ahead for its next launches (counted apart).
 */
export interface Held {
  /** Processes of instances (pids in the host's instance cgroups), and of walls booted ahead. */
  processes: number;
  warmWallProcesses: number;
  instancesRssMiB: number;
  instancesPssMiB: number;
  /** Charged to the instances' memory cgroups. */
  cgroupMiB: number;
  serviceRssMiB: number;
}

export interface SnapshotResults {
  samples: number;
  /**
   * RunMicrovm → RUNNING → token → first hello, each instance new (the baseline), each launched
   * once the host had a wall booted ahead waiting.
   */
  coldFirstRpc: Percentiles;
  /** How long each launch waited for the host's wall booted ahead to be up (its refill after the last). */
  wallWaitMs: Percentiles;
  /** SuspendMicrovm → its answer, SUSPENDED with the snapshot stored. */
  suspend: Percentiles;
  /** ResumeMicrovm → its answer (RUNNING) → first hello answered, on the host that suspended it. */
  resumeFirstRpc: Percentiles;
  /** The same with the host's own image removed: restored from the store's copy. */
  resumeFromStoreFirstRpc: Percentiles;
  /** Each cycle's suspend and resume ÷ the cold launch measured beside it. */
  ratios: { suspend: Percentiles; resume: Percentiles; resumeFromStore: Percentiles };
  /** A hello to a SUSPENDED instance with auto-resume → its answer. */
  autoResumeFirstRpc: Percentiles;
  /** Bytes stored per snapshot (runsc's image, uncompressed), and KV bytes per record. */
  snapshotBytes: Percentiles;
  recordBytes: Percentiles;
  /** `count` instances RUNNING (each answered one RPC), then all SUSPENDED. */
  held: { count: number; running: Held; suspended: Held; storedMiB: number };
}

const mib = (kib: number) => Math.round((kib / 1024) * 10) / 10;

export async function measureSnapshots(env: MicrovmEnvironment, settings: SnapshotSettings): Promise<SnapshotResults> {
  const kv = (await openBuckets(env.nc, { only: ["microvms"] })).microvms;
  const recordOf = async (microvmId: string) => {
    const entry = await kv.get(idKey(microvmId)!);
    if (!entry) throw new Error(`no record of ${microvmId}`);
    return { bytes: entry.length, stored: entry.json<{ checkpoint?: { bytes: number } }>().checkpoint?.bytes };
  };
  const s = {
    cold: [] as number[],
    wallWait: [] as number[],
    suspend: [] as number[],
    resume: [] as number[],
    fromStore: [] as number[],
    auto: [] as number[],
  };
  const localImages = join(hostWorkDir(env.dataDir, env.hostId), LOCAL_SNAPSHOTS_DIR);
  const sizes = { snapshot: [] as number[], record: [] as number[] };
  const suspend = async (vm: Connected) => {
    const answer = await env.api.suspendMicrovm({ microvmIdentifier: vm.microvmId });
    if (answer.state !== "SUSPENDED") throw new Error(`suspend of ${vm.microvmId} answered ${answer.state}`);
  };
  const timed = async (samples: number[], work: () => Promise<unknown>) => {
    const started = performance.now();
    await work();
    samples.push(performance.now() - started);
  };
  for (let i = 0; i < settings.samples; i++) {
    // The baseline between the cycles: load changes on the machine hit both alike. Launched
    // once a wall booted ahead waits (what a launch with the warm pool costs, its target's).
    s.wallWait.push(await wallReady(env.microvmUrl));
    const vm = await launchAndCall(env.api);
    s.cold.push(vm.firstRpcMs);
    await timed(s.suspend, () => suspend(vm));
    const record = await recordOf(vm.microvmId);
    if (record.stored === undefined) throw new Error(`${vm.microvmId} is SUSPENDED without a snapshot`);
    sizes.snapshot.push(record.stored);
    sizes.record.push(record.bytes);
    const resume = async () => {
      const answer = await env.api.resumeMicrovm({ microvmIdentifier: vm.microvmId });
      if (answer.state !== "RUNNING") throw new Error(`resume of ${vm.microvmId} answered ${answer.state}`);
      await expectHello(vm.stub);
    };
    await timed(s.resume, resume);
    await suspend(vm);
    await rm(localImages, { recursive: true, force: true });
    await timed(s.fromStore, resume);
    await suspend(vm);
    await timed(s.auto, () => expectHello(vm.stub));
    await terminate(env.api, vm.microvmId);
  }
  return {
    samples: settings.samples,
    coldFirstRpc: percentiles(s.cold),
    wallWaitMs: percentiles(s.wallWait),
    suspend: percentiles(s.suspend),
    resumeFirstRpc: percentiles(s.resume),
    resumeFromStoreFirstRpc: percentiles(s.fromStore),
    ratios: {
      suspend: percentiles(ratios(s.suspend, s.cold)),
      resume: percentiles(ratios(s.resume, s.cold)),
      resumeFromStore: percentiles(ratios(s.fromStore, s.cold)),
    },
    autoResumeFirstRpc: percentiles(s.auto),
    snapshotBytes: percentiles(sizes.snapshot),
    recordBytes: percentiles(sizes.record),
    held: await measureHeld(env, settings, recordOf),
  };
}

/** `settings.suspended` instances launched and called once, measured RUNNING, suspended, measured again. */
async function measureHeld(
  env: MicrovmEnvironment,
  settings: SnapshotSettings,
  recordOf: (microvmId: string) => Promise<{ stored?: number | undefined }>,
): Promise<SnapshotResults["held"]> {
  const live: Connected[] = [];
  try {
    await inBatches(settings.suspended, settings.concurrency, async () => {
      live.push(await launchAndCall(env.api));
    });
    await pause(1_000); // start-up garbage settles before memory is read
    const running = heldNow(env);
    // One at a time, as an idle policy spreads them (four at once on 2 loaded cores passed 30 s).
    for (const vm of live) {
      const answer = await env.api.suspendMicrovm({ microvmIdentifier: vm.microvmId });
      if (answer.state !== "SUSPENDED") throw new Error(`suspend of ${vm.microvmId} answered ${answer.state}`);
    }
    await pause(1_000);
    const suspended = heldNow(env);
    let stored = 0;
    for (const vm of live) stored += (await recordOf(vm.microvmId)).stored ?? 0;
    return { count: live.length, running, suspended, storedMiB: mib(stored / 1024) };
  } finally {
    await inBatches(live.length, settings.concurrency, (i) =>
      terminate(env.api, live[i]!.microvmId).catch(() => undefined),
    );
  }
}

function heldNow(env: MicrovmEnvironment): Held {
  const pids = pidsInHostGroup(hostCgroupKey(hostWorkDir(env.dataDir, env.hostId)));
  const instances = env.instances().filter((i) => !basename(i.memoryCgroup ?? "").startsWith(WARM_PREFIX));
  const memory = memoryOf(pids.instances);
  const cgroupKiB = instances.reduce((sum, i) => sum + (i.memoryCgroup ? cgroupMemoryKiB(i.memoryCgroup).usage : 0), 0);
  return {
    processes: memory.count,
    warmWallProcesses: pids.warm.length,
    instancesRssMiB: memory.total.rss,
    instancesPssMiB: memory.total.pss,
    cgroupMiB: mib(cgroupKiB),
    serviceRssMiB: mib(memoryKiB(env.servicePid).rss),
  };
}

/** `work(0..count-1)`, at most `concurrency` at a time. */
async function inBatches(count: number, concurrency: number, work: (i: number) => Promise<unknown>): Promise<void> {
  for (let first = 0; first < count; first += concurrency) {
    const batch = Array.from({ length: Math.min(concurrency, count - first) }, (_, k) => work(first + k));
    await Promise.all(batch);
  }
}

/** `samples[i] / baseline[i]`: each against the baseline measured beside it. */
const ratios = (samples: number[], baseline: number[]) => samples.map((value, i) => value / baseline[i]!);

/** The rows, for the console. */
export function formatSnapshots(r: SnapshotResults): string {
  const row = (name: string, p: Percentiles, unit = "ms") =>
    `| ${name} | ${p.p50.toFixed(0)} ${unit} | ${p.p99.toFixed(0)} ${unit} |`;
  const ratio = (name: string, p: Percentiles) => `| ${name} | ${p.p50.toFixed(2)} | ${p.p99.toFixed(2)} |`;
  const held = (name: string, h: Held) =>
    `| ${name} | ${h.processes} | ${h.instancesRssMiB} | ${h.instancesPssMiB} | ${h.cgroupMiB} | ` +
    `${h.serviceRssMiB} | ${h.warmWallProcesses} |`;
  return [
    `| ${r.samples} samples | p50 | p99 |`,
    "| --- | --- | --- |",
    row("cold RunMicrovm → first RPC (baseline)", r.coldFirstRpc),
    row("SuspendMicrovm → SUSPENDED (snapshot stored)", r.suspend),
    row("ResumeMicrovm → RUNNING → first RPC (the host's own image)", r.resumeFirstRpc),
    row("ResumeMicrovm → RUNNING → first RPC (the store's copy)", r.resumeFromStoreFirstRpc),
    ratio("suspend ÷ cold launch beside it", r.ratios.suspend),
    ratio("resume (own image) ÷ cold launch beside it", r.ratios.resume),
    ratio("resume (store's copy) ÷ cold launch beside it", r.ratios.resumeFromStore),
    row("RPC to a SUSPENDED instance (auto-resume)", r.autoResumeFirstRpc),
    row("snapshot stored", r.snapshotBytes, "bytes"),
    row("KV record of a SUSPENDED instance", r.recordBytes, "bytes"),
    "",
    `${r.held.count} instances (snapshots stored: ${r.held.storedMiB} MiB in all)`,
    "",
    "| state | instance processes | their VmRSS MiB | PSS MiB | cgroups MiB | service VmRSS MiB | processes of " +
      "walls booted ahead |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    held("RUNNING", r.held.running),
    held("SUSPENDED", r.held.suspended),
  ].join("\n");
}

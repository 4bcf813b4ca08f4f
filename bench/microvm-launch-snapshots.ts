// Launch from a snapshot vs cold start in the microVM bench (gVisor): RunMicrovm → first RPC of an
// image whose import is slow (test/images/heavy-init.ts, Ajv compiling 300 schemas), started cold
// on a host with launch snapshots off and restored on a host with them on under its own policy,
// taking turns; the snapshot's bytes on disk; and a check that restored instances draw their own
// randomUUID(). Each sample says whether it imported its image, so neither series is mislabelled.
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { ClientError } from "../client/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { bundleImageModule } from "../vm-runtime/service/index.ts";
import { hostWorkDir } from "../vm-runtime/service/index.ts";
import { root } from "./children.ts";
import { withMicrovmEnvironment, type MicrovmEnvironment } from "./microvm-environment.ts";
import { launch, mintToken, terminate } from "./microvm-instances.ts";
import { pause, percentiles, type Percentiles } from "./stats.ts";

const IMAGE_FILE = "test/images/heavy-init.ts";
const IMAGE_NAME = "bench-heavy-import";
/** The policy's own threshold (launch-snapshots.ts): the bench does not lower it. */
const THRESHOLD_MS = 1_000;
/** How long the restoring host may take to take its snapshot (import + checkpoint, in the background). */
const SNAPSHOT_READY_MS = 180_000;

export interface LaunchFromSnapshotResults {
  image: string;
  /** How the snapshot came to be, in words (the service's own policy; nothing lowered). */
  mechanism: string;
  samples: number;
  /**
   * createImage on the restoring host, ms: its check imports the image in an instance, the host's
   * first cold start of it, which the policy times like any (and may take the snapshot behind).
   */
  pushMs: number;
  /** Unmeasured RunMicrovm → first RPC on the restoring host that were cold, before its first restore. */
  warmupColdMs: number[];
  /** RunMicrovm → RUNNING → token → first RPC, each kind checked by what the instance says. */
  cold: Percentiles;
  restored: Percentiles;
  /** cold / restored, on p50 and on p99. */
  ratioP50: number;
  ratioP99: number;
  /** runsc's image files of the launch snapshot on the restoring host's disk. */
  snapshotBytes: number;
  /** Distinct randomUUID() among the restored samples (each must differ). */
  distinctUuids: number;
}

/** The row, or why it was aborted. */
export type LaunchFromSnapshotRow = LaunchFromSnapshotResults | { error: string };

interface Identity {
  /** MICROVM_ID when the module was imported: "" in a launch snapshot's template. */
  importedAs: string;
  importUuid: string;
  uuid: string;
}

interface Sample {
  ms: number;
  restored: boolean;
  identity: Identity;
}

/** Launch → RUNNING → token → first `identity()`; the instance is terminated after. */
async function firstRpc(env: MicrovmEnvironment): Promise<Sample> {
  const started = performance.now();
  const launched = await launch(env.api, IMAGE_NAME);
  try {
    const stub = connectMicrovm<{ identity(): Promise<Identity> }>({
      endpoint: launched.endpoint,
      authToken: await mintToken(env.api, launched.microvmId),
    });
    const identity = await stub.identity();
    const ms = performance.now() - started;
    if (identity.importedAs !== "" && identity.importedAs !== launched.microvmId)
      throw new Error(`${launched.microvmId} says it was imported as ${JSON.stringify(identity.importedAs)}`);
    return { ms, restored: identity.importedAs === "", identity };
  } finally {
    await terminate(env.api, launched.microvmId);
  }
}

/**
 * createImage, once more (twice at most) when its check ran out of time: the check gives an
 * instance 8 s to import, which this image can pass on 2 loaded cores (nothing here is timed).
 */
async function push(env: MicrovmEnvironment, module: string) {
  for (let attempt = 1; ; attempt++) {
    const started = performance.now();
    try {
      const image = await env.api.createImage({ name: IMAGE_NAME, module });
      return { image, ms: performance.now() - started };
    } catch (err) {
      const message = err instanceof ClientError ? String((err.error as { message?: unknown }).message) : "";
      if (attempt === 3 || !/within \d+ s/.test(message)) throw err;
      console.log(`  createImage ${IMAGE_NAME}: ${message}; again (attempt ${attempt + 1} of 3)`);
      await pause(5_000);
    }
  }
}

/** Cold starts on the restoring host until one is restored (its snapshot saved behind the first). */
async function untilRestored(env: MicrovmEnvironment): Promise<number[]> {
  const cold: number[] = [];
  const deadline = Date.now() + SNAPSHOT_READY_MS;
  for (;;) {
    const sample = await firstRpc(env);
    if (sample.restored) return cold;
    cold.push(Math.round(sample.ms));
    if (Date.now() > deadline)
      throw new Error(
        `no start was restored within ${SNAPSHOT_READY_MS / 1000} s; cold starts there: ${cold.join(", ")} ms (a ` +
          `snapshot is taken at a median ≥ ${THRESHOLD_MS} ms)`,
      );
    await pause(2_000);
  }
}

/** Bytes of the files of the image's launch snapshot (named by the module's digest) on the host's disk. */
async function snapshotBytes(env: MicrovmEnvironment, digest: string): Promise<number> {
  const prefix = `${digest.slice("sha256:".length, "sha256:".length + 32)}-`;
  const work = hostWorkDir(env.dataDir, env.hostId);
  for (const wall of await readdir(work)) {
    const dir = join(work, wall, "launch-snapshots");
    const keys = await readdir(dir).catch(() => [] as string[]);
    const key = keys.find((k) => k.startsWith(prefix));
    if (key) return sizeOf(join(dir, key));
  }
  throw new Error(`no launch snapshot of ${digest} under ${work}`);
}

async function sizeOf(path: string): Promise<number> {
  const info = await stat(path);
  if (!info.isDirectory()) return info.size;
  let total = 0;
  for (const name of await readdir(path)) total += await sizeOf(join(path, name));
  return total;
}

/** `samples` cold starts and restores taking turns, each checked to be what it is counted as. */
async function takeTurns(restoring: MicrovmEnvironment, cold: MicrovmEnvironment, samples: number) {
  const times = { cold: [] as number[], restored: [] as number[] };
  const restoredIds: Identity[] = [];
  for (let i = 0; i < samples; i++) {
    const c = await firstRpc(cold);
    if (c.restored) throw new Error("an instance of the host with launch snapshots off was not imported cold");
    times.cold.push(c.ms);
    const r = await firstRpc(restoring);
    if (!r.restored)
      throw new Error(
        `sample ${i + 1} on the restoring host started cold: its policy stopped restoring (restores not faster)`,
      );
    times.restored.push(r.ms);
    restoredIds.push(r.identity);
  }
  return { times, restoredIds };
}

/** Throws unless the instances came from one snapshot and each drew its own randomUUID(); how many distinct. */
function distinctRandomness(restoredIds: readonly Identity[]): number {
  if (new Set(restoredIds.map((id) => id.importUuid)).size !== 1)
    throw new Error("the restored instances did not all come from one snapshot (their import-time uuids differ)");
  const distinct = new Set(restoredIds.map((id) => id.uuid)).size;
  if (distinct !== restoredIds.length)
    throw new Error(
      `instances restored from one launch snapshot repeated randomUUID(): ${distinct} distinct of ` +
        `${restoredIds.length}`,
    );
  return distinct;
}

/** The comparison on `restoring` (launch snapshots on) and `cold` (off), `samples` of each taking turns. */
async function compare(
  restoring: MicrovmEnvironment,
  cold: MicrovmEnvironment,
  samples: number,
): Promise<LaunchFromSnapshotResults> {
  const module = await bundleImageModule(join(root, IMAGE_FILE));
  const { image, ms: pushMs } = await push(restoring, module);
  await push(cold, module);
  // Unmeasured, while the restoring host may still be taking its snapshot.
  await firstRpc(cold);
  const warmupColdMs = await untilRestored(restoring);
  const { times, restoredIds } = await takeTurns(restoring, cold, samples);
  const distinctUuids = distinctRandomness(restoredIds);
  const bytes = await snapshotBytes(restoring, image.digest);
  await Promise.all([restoring, cold].map((env) => env.api.deleteImage({ name: IMAGE_NAME })));
  const [c, r] = [percentiles(times.cold), percentiles(times.restored)];
  return {
    image: `${IMAGE_FILE} (Ajv compiling 300 schemas at import)`,
    mechanism:
      `the service's own policy (snapshot once the median cold start is ≥ ${THRESHOLD_MS} ms, restore ` +
      `while faster; nothing lowered); cold: a second gvisor service with MICROVM_LAUNCH_SNAPSHOTS=0`,
    samples,
    pushMs: Math.round(pushMs),
    warmupColdMs,
    cold: c,
    restored: r,
    ratioP50: Math.round((c.p50 / r.p50) * 100) / 100,
    ratioP99: Math.round((c.p99 / r.p99) * 100) / 100,
    snapshotBytes: bytes,
    distinctUuids,
  };
}

/**
 * The row on `restoring` (a gvisor service with launch snapshots on), against a second gvisor
 * service started for it with them off; a failed check or step aborts the row (not the run).
 */
export async function measureLaunchFromSnapshot(
  restoring: MicrovmEnvironment,
  samples: number,
): Promise<LaunchFromSnapshotRow> {
  try {
    return await withMicrovmEnvironment(
      { provider: "gvisor", maxInstances: 4, serviceEnv: { MICROVM_LAUNCH_SNAPSHOTS: "0" } },
      `launch snapshots off, for cold starts of ${IMAGE_FILE} taking turns with restores (${samples} each)`,
      (cold) => compare(restoring, cold, samples),
    );
  } catch (err) {
    const detail = err instanceof ClientError ? `: ${JSON.stringify(err.error)}` : "";
    return { error: `${(err as Error).message}${detail}` };
  }
}

/** The row, for the console. */
export function formatLaunchFromSnapshot(row: LaunchFromSnapshotRow): string {
  const title = "launch from snapshot vs cold start (RunMicrovm → first RPC)";
  if ("error" in row) return `${title}: ABORTED: ${row.error}`;
  const ms = (p: Percentiles) => `${p.p50.toFixed(0)} ms | ${p.p99.toFixed(0)} ms`;
  return [
    `${title}, ${row.image}, ${row.samples} of each taking turns`,
    `mechanism: ${row.mechanism}`,
    `createImage ${row.pushMs} ms (its check is the host's first cold start of the image); unmeasured launches ` +
      `on the restoring host that were still cold before its first restore: ` +
      `${row.warmupColdMs.map((ms) => `${ms} ms`).join(", ") || "none"}`,
    "",
    "| RunMicrovm → first RPC | p50 | p99 |",
    "| --- | --- | --- |",
    `| cold start (imports the image) | ${ms(row.cold)} |`,
    `| from its launch snapshot | ${ms(row.restored)} |`,
    `| cold / snapshot | ${row.ratioP50.toFixed(2)}x | ${row.ratioP99.toFixed(2)}x |`,
    "",
    `launch snapshot on disk: ${row.snapshotBytes} bytes (${(row.snapshotBytes / 1e6).toFixed(1)} MB); ` +
      `randomUUID() of the ${row.samples} restored instances: ${row.distinctUuids} distinct (checked)`,
  ].join("\n");
}

// Launch snapshots (gVisor): an image whose cold start is slow is imported once into a template
// wall that has no identity, saved with `runsc checkpoint` on this host's disk, and later
// instances of it are restored from that image instead of importing it again. Each restore is
// told its own id and secret after the restore, and its runtime makes its randomness fresh
// before it serves (runtime/fresh-entropy.ts). Used only while restores are measured faster.
import { createHash, randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { LOADED_LINE } from "../runtime/boot.ts";
import type { Tracked, WallOps } from "./isolated-walls.ts";
import { within } from "./provider-util.ts";
import type { MicrovmHandle } from "./provider.ts";

export interface LaunchSnapshotOptions {
  /** Cold starts (median of the last five) at least this slow get a launch snapshot (default 1000 ms). */
  readonly minColdMs?: number;
  /** Launch snapshots kept on disk at once; the least recently used goes first (default 8). */
  readonly maxImages?: number;
  /** Restore whatever the times say (benches comparing both ways; default false). */
  readonly alwaysRestore?: boolean;
}

/** What launch snapshots use of the provider that tracks the walls. */
export interface LaunchSnapshotDeps extends WallOps {
  /** The provider's work directory: snapshots go to `launch-snapshots/` in it. */
  workDir(): Promise<string>;
  readonly startTimeoutMs: number;
  /** Tells the operator once per image what went wrong (a failed save or restore). */
  log(message: string, cause?: unknown): void;
}

interface Saved {
  readonly dir: string;
  /** The host uid the template ran as: every restore of it runs as that uid. */
  readonly uid: number;
  readonly heapMiB: number;
  lastUsed: number;
}

interface ImageRecord {
  readonly coldMs: number[];
  /** Of those, the starts that found a wall booted ahead up and waiting. */
  readonly wallMs: number[];
  readonly restoreMs: number[];
  saved?: Saved;
  taking?: Promise<void>;
  /** A save or restore failed: this image starts cold for the rest of this process. */
  broken?: boolean;
}

const KEPT_TIMES = 5;

const median = (values: readonly number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? Number.NaN;
};

const remember = (values: number[], value: number) => {
  values.push(value);
  if (values.length > KEPT_TIMES) values.shift();
};

/** Names an image's module and heap size: one launch snapshot each. */
export function launchKey(module: Buffer, heapMiB: number): string {
  return `${createHash("sha256").update(module).digest("hex").slice(0, 32)}-${heapMiB}`;
}

export function launchSnapshots(deps: LaunchSnapshotDeps, options: LaunchSnapshotOptions = {}) {
  const minColdMs = options.minColdMs ?? 1_000;
  const maxImages = options.maxImages ?? 8;
  const images = new Map<string, ImageRecord>();
  let taking: Promise<void> = Promise.resolve();
  let closed = false;
  const recordOf = (key: string) => {
    let record = images.get(key);
    if (!record) images.set(key, (record = { coldMs: [], wallMs: [], restoreMs: [] }));
    return record;
  };

  /** Whether a restore is expected to beat a cold start of this image. */
  const worthIt = (record: ImageRecord) =>
    options.alwaysRestore === true || record.restoreMs.length === 0 || median(record.restoreMs) < median(record.coldMs);

  async function drop(record: ImageRecord): Promise<void> {
    const saved = record.saved;
    record.saved = undefined;
    if (saved) await rm(saved.dir, { recursive: true, force: true }).catch(() => undefined);
  }

  async function evict(): Promise<void> {
    const held = [...images.values()].filter((record) => record.saved);
    held.sort((a, b) => a.saved!.lastUsed - b.saved!.lastUsed);
    for (const record of held.slice(0, Math.max(0, held.length - maxImages))) await drop(record);
  }

  /** Imports the module into a template wall and saves it; one save at a time on a host. */
  async function take(key: string, record: ImageRecord, module: Buffer, heapMiB: number): Promise<void> {
    const deadline = Date.now() + deps.startTimeoutMs;
    const entry = await deps.boot(heapMiB, deadline, undefined, undefined, true);
    try {
      const loaded = new Promise<void>((resolve) => {
        const onLine = (line: string) => {
          if (line !== LOADED_LINE) return;
          entry.output.stdout.off("line", onLine);
          resolve();
        };
        entry.output.stdout.on("line", onLine);
      });
      const stdin = entry.launched.child.stdin;
      stdin?.write(`${JSON.stringify({ microvmId: "", moduleBytes: module.length })}\n`);
      stdin?.write(module);
      const ended = entry.exited.then(() => {
        throw new Error(`the template ended before its image loaded: ${entry.output.stderrTail.join("\n")}`);
      });
      await Promise.race([loaded, ended, timeout(deadline, "the template's image did not load in time")]);
      const dir = join(await deps.workDir(), "launch-snapshots", key);
      await rm(dir, { recursive: true, force: true });
      await mkdir(dir, { recursive: true, mode: 0o700 });
      entry.stopping = true;
      await entry.launched.checkpoint!(dir);
      if (!(await within(entry.released!, 5_000))) throw new Error("the template outlived its checkpoint");
      if (closed) return void (await rm(dir, { recursive: true, force: true }));
      record.saved = { dir, uid: entry.uid!, heapMiB, lastUsed: Date.now() };
      await evict();
    } catch (cause) {
      entry.stopping = true;
      await deps.forceStop(entry).catch(() => undefined);
      throw cause;
    }
  }

  return {
    /**
     * Starts an instance by restoring its image's launch snapshot: undefined when there is none
     * or restores are not faster (start it cold), or when the restore failed (logged once; the
     * snapshot is dropped and this image starts cold from then on).
     */
    async start(
      key: string,
      microvmId: string,
      deadline: number,
      signal: AbortSignal | undefined,
    ): Promise<MicrovmHandle | undefined> {
      const record = images.get(key);
      const saved = record?.saved;
      if (!record || !saved || record.broken || closed || !worthIt(record)) return undefined;
      saved.lastUsed = Date.now();
      const startedAt = Date.now();
      const secret = randomBytes(24).toString("base64url");
      let entry: Tracked | undefined;
      try {
        entry = await deps.boot(saved.heapMiB, deadline, signal, {
          microvmId,
          uid: saved.uid,
          heapMiB: saved.heapMiB,
          secret,
          imageDir: saved.dir,
          shared: true,
        });
        await deps.assign(entry, microvmId);
        // Read once the restored runtime runs again: its identity, after the restore.
        entry.launched.child.stdin?.write(`${JSON.stringify({ microvmId, secret })}\n`);
        const handle = await deps.answering(entry, microvmId, deadline, signal);
        remember(record.restoreMs, Date.now() - startedAt);
        return handle;
      } catch (cause) {
        if (entry) {
          entry.stopping = true;
          await deps.forceStop(entry).catch(() => undefined);
          await entry.exited;
        }
        if (signal?.aborted) throw cause;
        record.broken = true;
        deps.log(`launch snapshot of ${key} failed to restore; its instances start cold from now on`, cause);
        await drop(record);
        return undefined;
      }
    },

    /**
     * Whether a start of this image that finds a wall booted ahead up and waiting should take it
     * rather than restore its snapshot: until it has two such starts, and then when the fastest beat its fastest
     * restore (or, before any restore, the cold start that makes a snapshot worth taking). The
     * fastest, as each path costs at least that: a first start, or one beside a snapshot being
     * taken, is slower for reasons of its moment. A heavy import loses to its snapshot; a light
     * one wins on a wall.
     */
    wallFirst(key: string): boolean {
      const record = images.get(key);
      if (options.alwaysRestore === true) return false;
      // Two starts on a wall at least: an image's first start on a host pays for more than its import.
      if (!record || record.wallMs.length < 2) return true;
      const wall = Math.min(...record.wallMs);
      return record.restoreMs.length === 0 ? wall < minColdMs : wall <= Math.min(...record.restoreMs);
    },

    /**
     * Records a cold start's time (module sent → first answer; `onWall`: it took a wall booted
     * ahead that was up); may save a snapshot behind it.
     */
    noteCold(key: string, module: Buffer, heapMiB: number, ms: number, onWall = false): void {
      const record = recordOf(key);
      remember(record.coldMs, ms);
      if (onWall) remember(record.wallMs, ms);
      if (closed || record.saved || record.taking || record.broken || median(record.coldMs) < minColdMs) return;
      const took = taking.then(() => take(key, record, module, heapMiB));
      taking = took.catch(() => undefined);
      record.taking = took.then(
        () => undefined,
        (cause: unknown) => {
          record.broken = true;
          if (!closed) deps.log(`launch snapshot of ${key} could not be saved; its instances start cold`, cause);
        },
      );
      void record.taking.finally(() => (record.taking = undefined));
    },

    /** The images this host has timed, by key. */
    keys: () => [...images.keys()],

    /** What is known of an image (tests, benches). */
    stats(key: string) {
      const record = images.get(key);
      return {
        saved: record?.saved !== undefined,
        dir: record?.saved?.dir,
        broken: record?.broken === true,
        coldMs: [...(record?.coldMs ?? [])],
        restoreMs: [...(record?.restoreMs ?? [])],
      };
    },

    /** Resolves once no snapshot is being saved. */
    settled: () => taking,

    async close(): Promise<void> {
      closed = true;
      await taking;
      await Promise.all([...images.values()].map(drop));
    },
  };
}

export type LaunchSnapshots = ReturnType<typeof launchSnapshots>;

function timeout(deadline: number, message: string): Promise<never> {
  return new Promise((_, reject) => {
    const timer = setTimeout(() => reject(new Error(message)), Math.max(0, deadline - Date.now()));
    timer.unref();
  });
}

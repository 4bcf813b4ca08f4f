// What the sandbox (bubblewrap) and gVisor providers share: each instance runs inside a cgroup
// of its own (memory, CPU quota, process count; the freezer suspends it, a group kill ends it)
// under one host group with a host-wide cap, as a host uid of its own, and is reached through
// a unix socket in a directory the host made (runtime-socket.ts). A `Launcher` supplies the wall;
// isolated-boot.ts boots it, isolated-warm.ts keeps some ahead, isolated-ready.ts waits for its
// runtime, isolated-stop.ts ends it.
import { mkdir, readdir, readFile, rm } from "node:fs/promises";
import { availableParallelism, totalmem } from "node:os";
import { basename, join } from "node:path";
import { bootSlots } from "./boot-slots.ts";
import { existingHostCgroups, openHostCgroups, type HostCgroups, type InstanceCgroup } from "./cgroups.ts";
import { claimHost, reclaimGroup, type SweptHost } from "./host-sweep.ts";
import { uidPool } from "./instance-uids.ts";
import { wallBoot } from "./isolated-boot.ts";
import { checkpointing } from "./isolated-checkpoint.ts";
import { wallReadiness } from "./isolated-ready.ts";
import { forceStop, stopEntry, terminateEntry, watchOom } from "./isolated-stop.ts";
import { warmPool } from "./isolated-warm.ts";
import type { Launcher, Tracked } from "./isolated-walls.ts";
import { launchKey, launchSnapshots, type LaunchSnapshotOptions, type LaunchSnapshots } from "./launch-snapshots.ts";
import type { InstanceNode } from "./node-args.ts";
import { waitForHealth, type OutputSink } from "./process-io.ts";
import { bundleCache, type BundleCache } from "./provider-util.ts";
import { exitOf, startFailed } from "./start-failure.ts";
import { MODULE_BYTES_LIMIT } from "../runtime/startup-input.ts";
import {
  hostFailureOf,
  MicrovmProviderError,
  upstreamOf,
  type MicrovmHandle,
  type MicrovmProvider,
  type MicrovmSpec,
  type ReclaimedInstance,
  type Upstream,
} from "./provider.ts";
import { RUNTIME_STOPPED } from "../wire/state-reasons.ts";

export type { InstanceLaunch, Launched, Launcher, RestoreSource, Tracked } from "./isolated-walls.ts";

export const ISOLATED_START_TIMEOUT_MS = 25_000;

export interface IsolatedProviderOptions {
  /** Names this host's cgroup (one per host id, so reconcile finds what it left). */
  readonly hostKey: string;
  /** V8 heap cap in MiB (default 256); the cgroup allows heap + scratch + headroom in all. */
  readonly memoryMiB?: number;
  /** CPU quota per instance in cores (default 0.5). */
  readonly cpus?: number;
  /** CPU quota of all this host's instances together (default: every core). */
  readonly totalCpus?: number;
  /** Memory cap of all this host's instances together in MiB (default: half the machine's). */
  readonly totalMemoryMiB?: number;
  /** Processes and threads per instance (default 64). */
  readonly pids?: number;
  /** Size of the writable scratch tmpfs in MiB (default 64; counts against the memory cap). */
  readonly scratchMiB?: number;
  /** How long an instance may take to answer its first probe (default 25 s, inside the lifecycle's 30 s). */
  readonly startTimeoutMs?: number;
  /** How long a resumed instance may take to answer again (default 5 s). */
  readonly resumeTimeoutMs?: number;
  /** How long a restored instance may take to answer (default 15 s). */
  readonly restoreTimeoutMs?: number;
  /** Parent of bundles and instance directories (default: a fresh directory in the OS tmpdir). */
  readonly workDir?: string;
  /** First of the host uids instances run as when the host is root (`MICROVM_UID_BASE`). */
  readonly uidBase?: number;
  /**
   * Parent of the hosts' instance directories and lock files when root (default
   * `/run/typed-service-microvms`); every host sweeps what hosts that are gone left there.
   */
  readonly runDir?: string;
  /** Parent of the host cgroups in each hierarchy (default `typed-service-microvms`). */
  readonly cgroupParent?: string;
  /** Node's permission model inside as a third layer (default true; off only in tests). */
  readonly permissions?: boolean;
  /** The node binary instances run and its version (default: the host's own). */
  readonly node?: InstanceNode;
  /** Receives every line an instance prints (default: dropped). */
  readonly onOutput?: OutputSink;
  /**
   * Walls booted ahead, waiting for their image (default 1): a start takes one and sends it the
   * module, skipping the wall's and node's start-up. Only for the default heap size.
   */
  readonly warmInstances?: number;
  /**
   * Walls booting at once, until their runtime prints its boot line (default: four times the
   * host's cores over an instance's CPU quota, 16 for 2 cores and 0.5: a boot uses about half
   * its quota, and waits). Launches past it wait their turn, within their start timeout.
   * Restores take no slot.
   */
  readonly bootSlots?: number;
  /**
   * Start slow images from a launch snapshot, on walls that can checkpoint (default: off; the
   * microVM host turns it on). See launch-snapshots.ts.
   */
  readonly launchSnapshots?: LaunchSnapshotOptions | false;
  /** Tells the operator about a launch snapshot that failed (default: one stderr line). */
  readonly log?: (message: string, cause?: unknown) => void;
}

export interface IsolatedProvider extends MicrovmProvider {
  readonly cgroupVersion: 1 | 2;
  upstream(handle: MicrovmHandle, virtualPort: number): Upstream | undefined;
  live(): MicrovmHandle[];
  /** The cgroup of a live instance (tests and metrics). */
  cgroupOf(handle: MicrovmHandle): InstanceCgroup | undefined;
  /** The host uid of a live instance (tests). */
  uidOf(handle: MicrovmHandle): number | undefined;
  /** Walls booting now (holding a boot slot), launches waiting for a slot, and walls booted ahead up and waiting. */
  boots(): { readonly running: number; readonly waiting: number; readonly ready: number };
  prepare(images: readonly string[]): Promise<void>;
  reclaim(): Promise<ReclaimedInstance[]>;
  /** Launch snapshots, where this provider takes them (tests and benches read their times). */
  readonly launchSnapshots?: LaunchSnapshots | undefined;
  /** What the start-up sweep reclaimed of hosts that are gone (host-sweep.ts). */
  readonly swept: readonly SweptHost[];
  close(): Promise<void>;
}

const MiB = 1024 * 1024;
const RUN_ROOT = "/run/typed-service-microvms";

export async function createIsolatedProvider(
  options: IsolatedProviderOptions,
  launcher: Launcher,
): Promise<IsolatedProvider> {
  const totalCpus = options.totalCpus ?? availableParallelism();
  const totalMemoryBytes = (options.totalMemoryMiB ?? Math.floor(totalmem() / MiB / 2)) * MiB;
  const asRoot = process.getuid?.() === 0;
  const log =
    options.log ??
    ((message: string, cause?: unknown) =>
      process.stderr.write(`[microvm] ${message}${cause instanceof Error ? `: ${cause.message}` : ""}\n`));
  // The instance's uid must reach its socket directory to mount it: as root, a directory of
  // the host's own under /run whose ancestors it may pass through (but not list).
  const runRoot = asRoot ? (options.runDir ?? RUN_ROOT) : undefined;
  // Claimed before anything of the host is made, held until all of it is removed (close).
  const { lock, swept } = await claimHost({ ...options, runRoot, log });
  const cgroups: HostCgroups = await openHostCgroups(options.hostKey, {
    cpus: totalCpus,
    memoryBytes: totalMemoryBytes,
    ...(options.cgroupParent === undefined ? {} : { parent: options.cgroupParent }),
  }).catch(async (err: unknown) => {
    await lock.release();
    throw err;
  });
  const runDir = runRoot ? join(runRoot, options.hostKey) : undefined;
  if (runDir) await mkdir(runDir, { recursive: true, mode: 0o711 });
  const tracked = new Set<Tracked>();
  const bundles = bundleCache(options.workDir, `${launcher.name}-`);
  let closed = false;
  const stopOomWatch = watchOom(tracked);

  const heapMiB = options.memoryMiB ?? 256;
  const startTimeoutMs = options.startTimeoutMs ?? ISOLATED_START_TIMEOUT_MS;
  const cpus = options.cpus ?? 0.5;
  const slots = bootSlots(options.bootSlots ?? Math.max(1, Math.round((4 * totalCpus) / cpus)));
  const { boot, stopFailedWall } = wallBoot({
    launcher,
    cgroups,
    bundles,
    slots,
    uids: uidPool(options.uidBase),
    tracked,
    runDir,
    asRoot,
    cpus,
    pids: options.pids ?? 64,
    scratchMiB: options.scratchMiB ?? 64,
    permissions: options.permissions ?? true,
    onOutput: options.onOutput,
    closed: () => closed,
  });
  const { assign, answering } = wallReadiness(cgroups, launcher.name);
  const warm = warmPool({
    target: options.warmInstances ?? 1,
    heapMiB,
    startTimeoutMs,
    boot: (memoryMiB, deadline, signal, weight) => boot(memoryMiB, deadline, signal, undefined, false, weight),
    stop: stopEntry,
  });
  const wallOps = { boot, assign, answering, forceStop };
  const launches =
    launcher.restore && options.launchSnapshots && asRoot
      ? launchSnapshots(
          { ...wallOps, workDir: () => bundles.workDir(), startTimeoutMs, log },
          options.launchSnapshots || {},
        )
      : undefined;

  async function start(spec: MicrovmSpec, signal?: AbortSignal): Promise<MicrovmHandle> {
    const module = await imageModule(bundles, spec.image);
    if (closed) throw new MicrovmProviderError("provider is closed");
    const startedAt = Date.now();
    const deadline = startedAt + startTimeoutMs;
    const memoryMiB = spec.memoryMiB ?? heapMiB;
    const key = launches ? launchKey(module, memoryMiB) : "";
    // A wall booted ahead that is up beats a restore for an image that imports quickly.
    const onWall = memoryMiB === heapMiB && warm.ready > 0;
    // A restore that fails leaves the cold start at least half of the start's time.
    const restored =
      onWall && launches?.wallFirst(key) !== false
        ? undefined
        : await launches?.start(key, spec.microvmId, startedAt + startTimeoutMs / 2, signal);
    if (restored) return restored;
    const entry =
      (await warm.take(memoryMiB)) ??
      (await boot(memoryMiB, deadline, signal).catch((cause: unknown) => {
        throw hostFailureOf(cause) ?? new MicrovmProviderError(`instance ${spec.microvmId} did not start`, { cause });
      }));
    warm.refill();
    try {
      await assign(entry, spec.microvmId);
      const stdin = entry.launched.child.stdin;
      stdin?.write(`${JSON.stringify({ microvmId: spec.microvmId, moduleBytes: module.length })}\n`);
      stdin?.write(module);
      const handle = await answering(entry, spec.microvmId, deadline, signal, undefined, spec.imageTimeoutMs);
      launches?.noteCold(key, module, memoryMiB, Date.now() - startedAt, onWall);
      return handle;
    } catch (cause) {
      // How it ended by itself, if it did: after stopFailedWall, it ended by the kill.
      const exit = exitOf(entry.launched.child);
      // A wall booted ahead may have failed before its runtime came up: nothing of the image ran.
      throw (
        (await stopFailedWall(entry, cause, deadline, signal)) ??
        startFailed(spec.microvmId, {
          cause,
          exit,
          stderr: { tail: entry.output.stderrTail, errors: entry.output.stderrErrors },
          secret: entry.secret,
        })
      );
    }
  }

  /** The live entry of a handle: matched by its socket, so a stale handle finds nothing. */
  const entryOf = (handle: MicrovmHandle): Tracked | undefined => {
    for (const entry of tracked) {
      if (!entry.done && entry.handle && entry.handle.socketPath === handle.socketPath) return entry;
    }
    return undefined;
  };
  const liveEntry = (handle: MicrovmHandle): Tracked => {
    const entry = entryOf(handle);
    if (!entry) throw new MicrovmProviderError(`instance ${handle.microvmId} is not running`);
    return entry;
  };

  async function terminate(handle: MicrovmHandle, graceMs = 2_000): Promise<void> {
    const entry = entryOf(handle);
    if (entry) await terminateEntry(entry, handle.microvmId, graceMs);
  }

  const { checkpoint, restore } = checkpointing({
    ...wallOps,
    launcher,
    restoreTimeoutMs: options.restoreTimeoutMs ?? 15_000,
    closed: () => closed,
    liveEntry,
  });

  /** What its cgroup holds: the wall's memory and the instance's, its scratch files included. */
  const checkpointBound = async (handle: MicrovmHandle) => liveEntry(handle).cgroup.memoryBytes();

  /** Kills what is left in this host's cgroups and directories that no live wall holds. */
  async function reclaim(): Promise<ReclaimedInstance[]> {
    const killed: ReclaimedInstance[] = [];
    const own = new Set([...tracked].map((entry) => entry.cgroup.name));
    for (const group of cgroups.existing()) {
      if (own.has(group.name)) continue;
      // A zombie is still listed until it is reaped (by init, on its own time): it is not a
      // process left running.
      const pids = await reclaimGroup(group);
      if (pids.length > 0) killed.push({ pids });
    }
    if (runDir) {
      const dirs = new Set([...tracked].map((entry) => basename(entry.dir)));
      for (const name of await readdir(runDir).catch(() => [] as string[])) {
        if (!dirs.has(name)) await rm(join(runDir, name), { recursive: true, force: true }).catch(() => undefined);
      }
    }
    return killed;
  }

  /** Ends every wall, then removes what the host made and gives up its key. */
  async function close(): Promise<void> {
    closed = true;
    stopOomWatch();
    await warm.close(new MicrovmProviderError("provider is closed"));
    await launches?.close();
    await bundles.close();
    await Promise.all(
      [...tracked].map(async (entry) => {
        entry.stopping = true;
        if (entry.handle) await terminate(entry.handle, 500).catch(() => undefined);
        await forceStop(entry);
        // Its cgroup removed too: the host's group goes last.
        await entry.released;
      }),
    );
    if (bundles.madeDir) await rm(await bundles.madeDir, { recursive: true, force: true });
    if (runDir) await rm(runDir, { recursive: true, force: true }).catch(() => undefined);
    await cgroups.remove();
    // The key is given up only with nothing of it left; else a later sweep finds the rest.
    const left = (await existingHostCgroups(options.hostKey, options.cgroupParent)) !== undefined;
    await (left ? lock.abandon() : lock.release());
  }

  return {
    name: launcher.name,
    cgroupVersion: cgroups.version,
    start,
    ...(launcher.restore ? { checkpoint, restore, checkpointBound } : {}),
    async suspend(handle) {
      await liveEntry(handle)
        .cgroup.freeze()
        .catch((cause: unknown) => {
          throw new MicrovmProviderError(`instance ${handle.microvmId} did not freeze`, { cause });
        });
    },
    async resume(handle) {
      const entry = liveEntry(handle);
      await entry.cgroup.thaw();
      try {
        await waitForHealth(
          upstreamOf(handle, 8080)!,
          Date.now() + (options.resumeTimeoutMs ?? 5_000),
          handle.upstreamHeaders,
        );
      } catch (cause) {
        throw new MicrovmProviderError(`instance ${handle.microvmId} did not answer after resume`, { cause });
      }
    },
    terminate,
    isAlive: async (handle) => entryOf(handle) !== undefined,
    exited(handle) {
      const entry = entryOf(handle);
      if (!entry) return new Promise(() => undefined);
      return entry.exited.then(() =>
        entry.stopping ? new Promise<never>(() => undefined) : (entry.exitReason ?? RUNTIME_STOPPED),
      );
    },
    upstream: (handle, port): Upstream | undefined => (entryOf(handle) ? upstreamOf(handle, port) : undefined),
    live: () => [...tracked].flatMap((entry) => (entry.handle && !entry.done ? [entry.handle] : [])),
    cgroupOf: (handle) => entryOf(handle)?.cgroup,
    uidOf: (handle) => entryOf(handle)?.uid,
    boots: () => ({ running: slots.running, waiting: slots.waiting, ready: warm.ready }),
    async prepare(images) {
      await bundles.prepare(images);
      warm.refill();
    },
    reclaim,
    launchSnapshots: launches,
    swept,
    close,
  };
}

/** An image's module, bundled (or cached) by the host and read with a bound. */
async function imageModule(bundles: BundleCache, image: string): Promise<Buffer> {
  const files = await bundles.bundle(image).catch((cause: unknown) => {
    throw new MicrovmProviderError(`cannot build image ${image}`, { cause });
  });
  // The module is the host's own file (a cached image or a bundle it made): read with a bound.
  const module = await readFile(files.module);
  if (module.length > MODULE_BYTES_LIMIT) throw new MicrovmProviderError(`image ${image} is too large`);
  return module;
}

// What the sandbox (bubblewrap) and gVisor providers share: each instance runs inside a cgroup
// of its own (memory, CPU quota, process count; the freezer suspends it, a group kill ends it)
// under one host group with a host-wide cap, as a host uid of its own, and is reached through
// a unix socket in a directory the host made (runtime-socket.ts). A `Launcher` supplies the wall.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rm } from "node:fs/promises";
import { availableParallelism, totalmem } from "node:os";
import { basename, join } from "node:path";
import { bootSlots } from "./boot-slots.ts";
import {
  existingHostCgroups,
  openHostCgroups,
  type CgroupLimits,
  type HostCgroups,
  type InstanceCgroup,
} from "./cgroups.ts";
import { claimHost, reclaimGroup, type SweptHost } from "./host-sweep.ts";
import { checkpointing } from "./isolated-checkpoint.ts";
import { launchKey, launchSnapshots, type LaunchSnapshotOptions, type LaunchSnapshots } from "./launch-snapshots.ts";
import {
  membersEnded,
  noteMembers,
  type Launched,
  type Launcher,
  type RestoreSource,
  type Tracked,
} from "./isolated-walls.ts";
import { uidPool } from "./instance-uids.ts";
import type { InstanceNode } from "./node-args.ts";
import {
  bootLine,
  outputDrained,
  waitForExit,
  waitForHealth,
  watchOutput,
  withinImageShare,
  type OutputSink,
} from "./process-io.ts";
import { bundleCache, pollUntil, safeName, within } from "./provider-util.ts";
import { exitOf, startFailed } from "./start-failure.ts";
import { LAUNCH_TEMPLATE_LINE, MODULE_BYTES_LIMIT } from "../runtime/startup-input.ts";
import { makeSocketDir, openRuntimeSocket, type RuntimeSocket } from "./runtime-socket.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";
import {
  hostFailureOf,
  MicrovmHostError,
  MicrovmProviderError,
  upstreamOf,
  type MicrovmHandle,
  type MicrovmProvider,
  type MicrovmSpec,
  type ReclaimedInstance,
  type Upstream,
} from "./provider.ts";

export type { InstanceLaunch, Launched, Launcher, RestoreSource, Tracked } from "./isolated-walls.ts";

/** How long a start may take by default: the wall's boot and the image's readiness answer. */
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
  /** Walls booting now (holding a boot slot) and launches waiting for a slot. */
  boots(): { readonly running: number; readonly waiting: number };
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
const OOM_POLL_MS = 250;
/** Names a wall booted ahead until it is assigned its instance. */
export const WARM_PREFIX = "warm-";
/** Node's own memory beyond its heap (code, buffers, the runtime). */
const NODE_HEADROOM_MIB = 128;

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
  const uids = uidPool(options.uidBase);
  /** Uids of launch snapshots' templates: never given back, shared by their restores. */
  const launchUids = new Set<number>();
  const runDir = runRoot ? join(runRoot, options.hostKey) : undefined;
  if (runDir) await mkdir(runDir, { recursive: true, mode: 0o711 });
  const tracked = new Set<Tracked>();
  const bundles = bundleCache(options.workDir, `${launcher.name}-`);
  let closed = false;
  const warmTarget = options.warmInstances ?? 1;
  const warm: Tracked[] = [];
  const booting = new Set<Promise<unknown>>();
  // Walls booted ahead are given up at close, not waited for to come up.
  const closing = new AbortController();
  // The OOM killer may end one process of a wall (gVisor's Sentry, a helper) and leave the rest
  // waiting: an instance with an OOM kill is over, whatever still runs of it.
  const oomWatch = setInterval(() => {
    for (const entry of tracked) {
      if (!entry.done && !entry.stopping && entry.cgroup.oomKills() > 0) void forceStop(entry).catch(() => undefined);
    }
  }, OOM_POLL_MS);
  oomWatch.unref();

  const heapMiB = options.memoryMiB ?? 256;
  const scratchMiB = options.scratchMiB ?? 64;
  const startTimeoutMs = options.startTimeoutMs ?? ISOLATED_START_TIMEOUT_MS;
  const slots = bootSlots(options.bootSlots ?? Math.max(1, Math.round((4 * totalCpus) / (options.cpus ?? 0.5))));
  const limitsFor = (memoryMiB: number): CgroupLimits => ({
    memoryBytes: (memoryMiB + scratchMiB + NODE_HEADROOM_MIB + launcher.overheadMiB) * MiB,
    cpus: options.cpus ?? 0.5,
    pids: (options.pids ?? 64) + launcher.overheadPids,
  });

  /**
   * Starts a wall around a runtime that waits for its image; resolves once the wall is up (not
   * waiting for node: a start sends the module at once). Every failure is the host's
   * (`MicrovmHostError`): no image has been sent yet.
   */
  async function boot(
    memoryMiB: number,
    deadline: number,
    signal?: AbortSignal,
    restoring?: RestoreSource,
    template = false,
  ): Promise<Tracked> {
    if (closed) throw new MicrovmProviderError("provider is closed");
    // A restore boots no runtime: it resumes one from its image.
    if (restoring) return bootWall(memoryMiB, deadline, signal, restoring, template);
    const slot = await slots.take(deadline, signal, (waitedMs) => {
      const busy = `${slots.running} walls were booting and ${slots.waiting} launches, this one among them, waited`;
      return new MicrovmHostError(`the host was too busy to boot an instance's wall: ${busy} (${waitedMs} ms)`, {
        timedOut: true,
      });
    });
    let entry: Tracked;
    try {
      entry = await bootWall(memoryMiB, deadline, signal, restoring, template);
    } catch (err) {
      slot.release();
      throw err;
    }
    // The slot is the wall's until its runtime is up (the boot line), it ends, or its start's
    // deadline passes (that start then fails and stops it).
    void bootLine(entry.output, deadline, undefined, entry.exited).then(slot.release, slot.release);
    return entry;
  }

  /** `boot` once its turn came. */
  async function bootWall(
    memoryMiB: number,
    deadline: number,
    signal: AbortSignal | undefined,
    restoring: RestoreSource | undefined,
    template: boolean,
  ): Promise<Tracked> {
    const runtimeFile = await bundles.runtime().catch((cause: unknown) => {
      throw new MicrovmHostError("the host could not bundle the instance runtime", { cause });
    });
    if (closed) throw new MicrovmProviderError("provider is closed");
    const name = `${WARM_PREFIX}${randomBytes(6).toString("hex")}`;
    const dir = join(runDir ?? join(await bundles.workDir(), "instances"), name);
    // A restored instance runs as the uid it was saved with: its socket directory must be its own.
    // A launch snapshot's restores share its template's uid, which the snapshot keeps for this
    // provider's life (an instance restored from it and later suspended comes back as it, too).
    const shared = restoring !== undefined && (restoring.shared === true || launchUids.has(restoring.uid));
    if (restoring && !shared && !(asRoot && uids.claim(restoring.uid)))
      throw new MicrovmProviderError(`uid ${restoring.uid} of the checkpoint is not free here`);
    const ownsUid = !template && !shared;
    const cgroup = await cgroups.create(name, limitsFor(memoryMiB)).catch((cause: unknown) => {
      if (restoring && ownsUid) uids.give(restoring.uid);
      throw new MicrovmHostError("the host could not make an instance's cgroup", { cause });
    });
    const uid = restoring ? restoring.uid : asRoot ? uids.take() : undefined;
    if (template && uid !== undefined) launchUids.add(uid);
    const release = async (group: InstanceCgroup) => {
      await group.kill().catch(() => undefined);
      await group.remove().catch(() => undefined);
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      if (uid !== undefined && ownsUid) uids.give(uid);
    };
    let launched: Launched;
    try {
      const socketDir = makeSocketDir(dir, "run", uid);
      const launch = {
        name,
        runtimeFile,
        cgroup,
        uid,
        dir,
        socketDir,
        heapMiB: memoryMiB,
        scratchBytes: scratchMiB * MiB,
        pids: options.pids ?? 64,
        permissions: options.permissions ?? true,
        launchTemplate: template || shared,
      };
      launched = restoring ? await launcher.restore!(launch, restoring.imageDir) : await launcher.launch(launch);
    } catch (cause) {
      await release(cgroup);
      throw new MicrovmHostError("the host could not start an instance's wall", {
        cause,
        missing: launcher.needs.filter((path) => !existsSync(path)),
      });
    }
    const { child } = launched;
    // The wall's process can exit while its children are still ending: the instance is gone
    // once its cgroup is empty and every process noted in it has ended (a zombie has).
    const exited = waitForExit(child).then(async () => {
      await pollUntil(() => entry.cgroup.pids().length === 0 && membersEnded(entry), 2_000);
    });
    const secret = restoring?.secret ?? randomBytes(24).toString("base64url");
    const output = watchOutput(child, name, (_name, stream, line) =>
      options.onOutput?.(entry.microvmId ?? name, stream, line),
    );
    const entry: Tracked = {
      launched,
      cgroup,
      exited,
      uid,
      dir,
      secret,
      heapMiB: memoryMiB,
      output,
      done: false,
      stopping: false,
      members: new Map(),
    };
    tracked.add(entry);
    entry.released = entry.exited.then(async () => {
      entry.done = true;
      entry.exitReason =
        entry.cgroup.oomKills() > 0
          ? "InstanceExited: out of memory (the instance reached its memory limit)"
          : "InstanceExited: the instance's runtime stopped";
      entry.socket?.close();
      // A rename under way (assign) would leave the group under its new name.
      await entry.renaming?.catch(() => undefined);
      await release(entry.cgroup);
      tracked.delete(entry);
    });
    // A restored runtime has its secret in the memory it was saved with (a launch snapshot's
    // is told it after the restore); a template gets none.
    if (!restoring) child.stdin?.write(`${template ? LAUNCH_TEMPLATE_LINE : secret}\n`);
    try {
      await launched.ready(deadline, signal, output.stderrTail);
      // Its shell joins each hierarchy's group before it becomes the wall: done before the
      // group may be renamed for its instance.
      const joined = await pollUntil(
        () => child.pid !== undefined && (entry.cgroup.holds(child.pid) || child.exitCode !== null),
        Math.max(0, deadline - Date.now()),
      );
      if (!joined) throw new Error("the wall did not join its cgroup in time");
    } catch (cause) {
      throw (
        (await stopFailedWall(entry, cause, deadline, signal)) ??
        new MicrovmHostError("the host could not start an instance's wall", { cause })
      );
    }
    return entry;
  }

  /**
   * Stops a wall that did not come up and says why it failed: the host's failure (its stderr
   * read to the end, the files it needs that are missing) while its runtime had not printed its
   * boot line, else undefined (the image's doing).
   */
  async function stopFailedWall(
    entry: Tracked,
    cause: unknown,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<MicrovmHostError | undefined> {
    const bootedBefore = entry.output.booted;
    await forceStop(entry);
    await entry.exited;
    await outputDrained(entry.launched.child, 1_000);
    // A wall stopped because time ran out is judged by what it had printed by then: a boot line
    // read while it was being killed does not make the host's slowness the image's.
    const timedOut = Date.now() >= deadline || signal?.aborted === true;
    if (timedOut ? bootedBefore : entry.output.booted) return undefined;
    return new MicrovmHostError("the host could not start an instance's wall", {
      cause,
      timedOut,
      stderr: entry.output.stderrTail.join("\n"),
      missing: launcher.needs.filter((path) => !existsSync(path)),
    });
  }

  /** Boots walls in the background until `warmTarget` wait; a failed boot is left to the next start. */
  function refill(): void {
    while (!closed && warm.length + booting.size < warmTarget) {
      const booted = boot(heapMiB, Date.now() + startTimeoutMs, closing.signal).then(
        (entry) => {
          if (closed) return stopEntry(entry);
          warm.push(entry);
        },
        () => undefined,
      );
      booting.add(booted);
      void booted.finally(() => booting.delete(booted));
    }
  }

  function takeWarm(memoryMiB: number): Tracked | undefined {
    if (memoryMiB !== heapMiB) return undefined;
    for (let entry = warm.shift(); entry; entry = warm.shift()) if (!entry.done) return entry;
    return undefined;
  }

  async function start(spec: MicrovmSpec, signal?: AbortSignal): Promise<MicrovmHandle> {
    const files = await bundles.bundle(spec.image).catch((cause: unknown) => {
      throw new MicrovmProviderError(`cannot build image ${spec.image}`, { cause });
    });
    // The module is the host's own file (a cached image or a bundle it made): read with a bound.
    const module = await readFile(files.module);
    if (module.length > MODULE_BYTES_LIMIT) throw new MicrovmProviderError(`image ${spec.image} is too large`);
    if (closed) throw new MicrovmProviderError("provider is closed");
    const startedAt = Date.now();
    const deadline = startedAt + startTimeoutMs;
    const memoryMiB = spec.memoryMiB ?? heapMiB;
    const key = launches ? launchKey(module, memoryMiB) : "";
    // A restore that fails leaves the cold start at least half of the start's time.
    const restored = await launches?.start(key, spec.microvmId, startedAt + startTimeoutMs / 2, signal);
    if (restored) return restored;
    let warmEntry = takeWarm(memoryMiB);
    // A wall being booted ahead is ready sooner than one booted now.
    while (!warmEntry && memoryMiB === heapMiB && booting.size > 0) {
      await Promise.race(booting);
      warmEntry = takeWarm(memoryMiB);
    }
    const entry =
      warmEntry ??
      (await boot(memoryMiB, deadline, signal).catch((cause: unknown) => {
        throw hostFailureOf(cause) ?? new MicrovmProviderError(`instance ${spec.microvmId} did not start`, { cause });
      }));
    refill();
    try {
      await assign(entry, spec.microvmId);
      const stdin = entry.launched.child.stdin;
      stdin?.write(`${JSON.stringify({ microvmId: spec.microvmId, moduleBytes: module.length })}\n`);
      stdin?.write(module);
      const handle = await answering(entry, spec.microvmId, deadline, signal, undefined, spec.imageTimeoutMs);
      launches?.noteCold(key, module, memoryMiB, Date.now() - startedAt);
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

  /** Names a wall after the instance it now serves (its cgroup too). */
  async function assign(entry: Tracked, microvmId: string): Promise<void> {
    entry.microvmId = microvmId;
    // A wall that ended keeps its name: its group is being removed under it.
    if (entry.done) return;
    const renaming = cgroups.rename(entry.cgroup, `${safeName(microvmId)}-${randomBytes(4).toString("hex")}`);
    entry.renaming = renaming;
    entry.cgroup = await renaming;
  }

  /**
   * Waits (after `before`, if given) for the runtime's socket and its answer to the readiness
   * probe, or for the instance to exit first; resolves with its handle. With `imageTimeoutMs`
   * the image has that long from its runtime's boot line (`MicrovmSpec.imageTimeoutMs`).
   */
  async function answering(
    entry: Tracked,
    microvmId: string,
    deadline: number,
    signal: AbortSignal | undefined,
    before?: (probeSignal: AbortSignal) => Promise<void>,
    imageTimeoutMs?: number,
  ): Promise<MicrovmHandle> {
    const upstreamHeaders = { [INSTANCE_SECRET_HEADER]: entry.secret };
    await healthyOrExited(
      entry,
      () => entry.output.stderrTail,
      async (probeSignal) => {
        await before?.(probeSignal);
        const bounds = { hostDeadline: deadline, imageTimeoutMs, signal: probeSignal };
        await withinImageShare(entry.output, bounds, async (readyBy, readySignal = probeSignal) => {
          const socket = await socketOf(join(entry.dir, "run"), readyBy, readySignal);
          entry.socket = socket;
          await waitForHealth({ socketPath: socket.path, headers: {} }, readyBy, upstreamHeaders, readySignal);
        });
      },
      signal,
    );
    noteMembers(entry);
    const pid = entry.launched.pid();
    entry.handle = {
      microvmId,
      provider: launcher.name,
      host: "",
      ports: {},
      socketPath: entry.socket!.path,
      ...(pid === undefined ? {} : { pid }),
      upstreamHeaders,
      startedAt: new Date().toISOString(),
    };
    return entry.handle;
  }

  async function stopEntry(entry: Tracked): Promise<void> {
    entry.stopping = true;
    noteMembers(entry);
    await entry.launched.stop().catch(() => undefined);
    if (!(await within(entry.exited, 500))) await forceStop(entry);
    await entry.released;
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
    if (!entry) return;
    entry.stopping = true;
    noteMembers(entry);
    await entry.cgroup.thaw().catch(() => undefined);
    await entry.launched.stop().catch(() => undefined);
    if (await within(entry.exited, graceMs)) return;
    await forceStop(entry);
    if (!(await within(entry.exited, 5_000)))
      throw new MicrovmProviderError(`instance ${handle.microvmId} survived SIGKILL`);
  }

  async function forceStop(entry: Tracked): Promise<void> {
    noteMembers(entry);
    await entry.cgroup.thaw().catch(() => undefined);
    await entry.launched.kill().catch(() => undefined);
    if (await within(entry.exited, 1_000)) return;
    await entry.cgroup.kill().catch(() => undefined);
    entry.launched.child.kill("SIGKILL");
  }

  const launches =
    launcher.restore && options.launchSnapshots && asRoot
      ? launchSnapshots(
          {
            boot,
            assign,
            answering,
            forceStop,
            workDir: () => bundles.workDir(),
            startTimeoutMs,
            log,
          },
          options.launchSnapshots || {},
        )
      : undefined;

  const { checkpoint, restore } = checkpointing({
    launcher,
    restoreTimeoutMs: options.restoreTimeoutMs ?? 15_000,
    closed: () => closed,
    liveEntry,
    boot,
    assign,
    answering,
    forceStop,
  });

  /** What its cgroup holds: the wall's memory and the instance's, its scratch files included. */
  const checkpointBound = async (handle: MicrovmHandle) => liveEntry(handle).cgroup.memoryBytes();

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
        entry.stopping
          ? new Promise<string>(() => undefined)
          : (entry.exitReason ?? "InstanceExited: the instance's runtime stopped"),
      );
    },
    upstream: (handle, port): Upstream | undefined => (entryOf(handle) ? upstreamOf(handle, port) : undefined),
    live: () => [...tracked].flatMap((entry) => (entry.handle && !entry.done ? [entry.handle] : [])),
    cgroupOf: (handle) => entryOf(handle)?.cgroup,
    uidOf: (handle) => entryOf(handle)?.uid,
    boots: () => ({ running: slots.running, waiting: slots.waiting }),
    async prepare(images) {
      await bundles.prepare(images);
      refill();
    },
    async reclaim() {
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
    },
    launchSnapshots: launches,
    swept,
    async close() {
      closed = true;
      clearInterval(oomWatch);
      closing.abort(new MicrovmProviderError("provider is closed"));
      await Promise.allSettled(booting);
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
    },
  };
}

/** Waits for the runtime's socket to appear in `dir`; fails at once on anything else there. */
async function socketOf(dir: string, deadline: number, signal: AbortSignal): Promise<RuntimeSocket> {
  for (;;) {
    signal.throwIfAborted();
    const socket = openRuntimeSocket(dir);
    if (socket) return socket;
    if (Date.now() > deadline) throw new Error("the runtime did not create its socket in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Waits for the readiness probe, or fails as soon as the instance exits (an image that
 * throws while loading), with the last lines it wrote to stderr.
 */
async function healthyOrExited(
  entry: { readonly exited: Promise<void> },
  stderrTail: () => string[],
  probe: (signal: AbortSignal) => Promise<void>,
  signal: AbortSignal | undefined,
): Promise<void> {
  const stop = new AbortController();
  const died = entry.exited.then(() => {
    const tail = stderrTail().join("\n");
    throw new Error(`instance exited before it was ready${tail ? `:\n${tail}` : ""}`);
  });
  died.catch(() => undefined);
  try {
    await Promise.race([probe(signal ? AbortSignal.any([signal, stop.signal]) : stop.signal), died]);
  } finally {
    stop.abort();
  }
}

/**
 * Starts `command` inside `cgroup`: a shell writes its own pid to each group's `cgroup.procs`,
 * then becomes the command (same pid), so nothing of the instance ever runs outside its group.
 * It dies with the host from its first instruction on: setpriv asks for SIGKILL when its parent
 * dies, and the shell ends at once if the host died before that (its parent is no longer the
 * host), so a wall being started when the host is killed is not left behind (the wall's own
 * --die-with-parent or --pdeathsig comes only once the command runs).
 * `extraFds` become fds 3, 4, … of the command (a pipe where `"pipe"`).
 */
export function spawnInCgroup(
  cgroup: InstanceCgroup,
  command: readonly string[],
  extraFds: readonly (number | "pipe")[] = [],
): ChildProcess {
  const script =
    '[ "$PPID" = "$1" ] || exit 98; shift; while [ "$1" != "--" ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"';
  const shell = ["/bin/sh", "-c", script, "microvm-sandbox", String(process.pid), ...cgroup.procsFiles];
  const child = spawn("setpriv", ["--pdeathsig", "KILL", "--", ...shell, "--", ...command], {
    stdio: ["pipe", "pipe", "pipe", ...extraFds],
    env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
  });
  child.stdin?.on("error", () => undefined);
  child.on("error", () => undefined);
  return child;
}

/** Sends a signal to a pid that may be gone already. */
export function sendSignal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone already.
  }
}

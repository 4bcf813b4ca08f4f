// The default provider: each instance runs in a bubblewrap sandbox (own user, PID, mount, IPC
// and network namespaces; read-only node and bundle; bounded tmpfs scratch) inside a cgroup of
// its own (memory, CPU quota, process count; the freezer suspends it, a group kill ends it).
// The proxy reaches the runtime through its unix socket, via the sandbox's /proc root.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { open, rm } from "node:fs/promises";
import { availableParallelism } from "node:os";
import type { Readable } from "node:stream";
import { openHostCgroups, type CgroupLimits, type HostCgroups, type InstanceCgroup } from "./cgroups.ts";
import { waitForExit, waitForHealth, watchOutput, type OutputSink } from "./process-io.ts";
import { isProcessAlive, readProcStat } from "./proc.ts";
import { bundleCache, pollUntil, safeName, within } from "./provider-util.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";
import { SANDBOX_PATHS, sandboxArgs, sharedLibraries } from "./sandbox-command.ts";
import {
  MicrovmProviderError,
  upstreamOf,
  type MicrovmHandle,
  type MicrovmProvider,
  type MicrovmSpec,
  type ReclaimedInstance,
  type Upstream,
} from "./provider.ts";

export interface SandboxProviderOptions {
  /** Names this host's cgroup (one per host id, so reconcile finds what it left). */
  readonly hostKey: string;
  /** V8 heap cap in MiB (default 256); the cgroup allows `heap + scratch + 128` MiB in all. */
  readonly memoryMiB?: number;
  /** CPU quota per instance in cores (default 0.5). */
  readonly cpus?: number;
  /** CPU quota of all this host's instances together (default: every core; contention is settled by a low weight). */
  readonly totalCpus?: number;
  /** Processes and threads per instance (default 64). */
  readonly pids?: number;
  /** Size of the writable scratch tmpfs in MiB (default 64; counts against the memory cap). */
  readonly scratchMiB?: number;
  /** How long an instance may take to answer its first probe (default 25 s, inside the lifecycle's 30 s). */
  readonly startTimeoutMs?: number;
  /** How long a resumed instance may take to answer again (default 5 s). */
  readonly resumeTimeoutMs?: number;
  /** Parent of bundles (default: a fresh directory in the OS tmpdir). */
  readonly workDir?: string;
  /** The bubblewrap binary (default `bwrap` on PATH). */
  readonly bwrap?: string;
  /** Host uid/gid the sandbox runs as when the host is root (default 65534, nobody). */
  readonly hostUid?: number;
  /** Parent of the host cgroups in each hierarchy (default `typed-service-microvms`). */
  readonly cgroupParent?: string;
  /** Node's permission model inside the sandbox as a second wall (default true). */
  readonly permissions?: boolean;
  /** Receives every line an instance prints (default: dropped). */
  readonly onOutput?: OutputSink;
}

export interface SandboxProvider extends MicrovmProvider {
  readonly cgroupVersion: 1 | 2;
  upstream(handle: MicrovmHandle, virtualPort: number): Upstream | undefined;
  live(): MicrovmHandle[];
  /** The cgroup of a live instance (tests and metrics). */
  cgroupOf(handle: MicrovmHandle): InstanceCgroup | undefined;
  prepare(images: readonly string[]): Promise<void>;
  reclaim(): Promise<ReclaimedInstance[]>;
  close(): Promise<void>;
}

interface Tracked {
  readonly child: ChildProcess;
  readonly cgroup: InstanceCgroup;
  readonly exited: Promise<void>;
  done: boolean;
  /** Set when terminate or close ends it: its exit is then no news. */
  stopping: boolean;
  /** Why it ended, read from its cgroup before the group is removed. */
  exitReason?: string;
  /** Pid (host namespace) of the sandbox's init; the runtime's socket is under its /proc root. */
  sandboxPid?: number;
  handle?: MicrovmHandle;
}

const MiB = 1024 * 1024;
const HEADROOM_MIB = 128;
const INFO_FD = 3;
const BUNDLE_FD = 4;
const MODULE_FD = 5;

export async function createSandboxProvider(options: SandboxProviderOptions): Promise<SandboxProvider> {
  const totalCpus = options.totalCpus ?? availableParallelism();
  const cgroups: HostCgroups = await openHostCgroups(options.hostKey, totalCpus, options.cgroupParent);
  const libraries = sharedLibraries(process.execPath);
  const tracked = new Map<string, Tracked>();
  const bundles = bundleCache(options.workDir, "sandbox-");
  let closed = false;

  const heapMiB = options.memoryMiB ?? 256;
  const scratchMiB = options.scratchMiB ?? 64;
  const limitsFor = (spec: MicrovmSpec): CgroupLimits => ({
    memoryBytes: ((spec.memoryMiB ?? heapMiB) + scratchMiB + HEADROOM_MIB) * MiB,
    cpus: options.cpus ?? 0.5,
    pids: options.pids ?? 64,
  });

  async function start(spec: MicrovmSpec, signal?: AbortSignal): Promise<MicrovmHandle> {
    const files = await bundles.bundle(spec.image).catch((cause: unknown) => {
      throw new MicrovmProviderError(`cannot build image ${spec.image}`, { cause });
    });
    if (closed) throw new MicrovmProviderError("provider is closed");
    const cgroup = await cgroups.create(
      `${safeName(spec.microvmId)}-${randomBytes(4).toString("hex")}`,
      limitsFor(spec),
    );
    const secret = randomBytes(24).toString("base64url");
    const bundleFd = await open(files.runtime, "r");
    const moduleFd = await open(files.module, "r").catch(async (err: unknown) => {
      await Promise.all([bundleFd.close(), moduleFd.close()]);
      await cgroup.remove().catch(() => undefined);
      throw new MicrovmProviderError(`cannot read image ${spec.image}`, { cause: err });
    });
    const child = spawnSandbox(
      options,
      cgroup,
      [bundleFd.fd, moduleFd.fd],
      sandboxArgs({
        bwrap: options.bwrap ?? "bwrap",
        node: process.execPath,
        libraries,
        bundleFd: BUNDLE_FD,
        moduleFd: MODULE_FD,
        scratchBytes: scratchMiB * MiB,
        heapMiB: spec.memoryMiB ?? heapMiB,
        microvmId: spec.microvmId,
        permissions: options.permissions ?? true,
        infoFd: INFO_FD,
      }),
    );
    await Promise.all([bundleFd.close(), moduleFd.close()]);
    // bwrap can exit as soon as its command has, while the sandbox's init is still ending: the
    // instance is gone once that init is too (a zombie counts as gone).
    const exited = waitForExit(child).then(async () => {
      if (entry.sandboxPid !== undefined) await pollUntil(() => !isProcessAlive(entry.sandboxPid!), 2_000);
    });
    const entry: Tracked = { child, cgroup, exited, done: false, stopping: false };
    tracked.set(cgroup.name, entry);
    void entry.exited.then(async () => {
      entry.done = true;
      entry.exitReason =
        cgroup.oomKills() > 0
          ? "InstanceExited: out of memory (the instance reached its memory limit)"
          : "InstanceExited: the instance's runtime stopped";
      // The sandbox's init is gone, so is everything in its PID namespace; the group may
      // still hold a process that had not joined it yet: kill before removing.
      await cgroup.kill().catch(() => undefined);
      await cgroup.remove().catch(() => undefined);
      tracked.delete(cgroup.name);
    });
    child.stdin?.write(`${secret}\n`);
    const upstreamHeaders = { [INSTANCE_SECRET_HEADER]: secret };
    const deadline = Date.now() + (options.startTimeoutMs ?? 25_000);
    try {
      const output = watchOutput(child, spec.microvmId, options.onOutput);
      entry.sandboxPid = await sandboxPidOf(child, deadline, signal, output.stderrTail);
      const socketPath = socketOf(entry.sandboxPid);
      await healthyOrExited(
        entry,
        () => output.stderrTail,
        (probeSignal) => waitForHealth({ socketPath, headers: {} }, deadline, upstreamHeaders, probeSignal),
        signal,
      );
      entry.handle = {
        microvmId: spec.microvmId,
        provider: "sandbox",
        host: "",
        ports: {},
        socketPath,
        pid: entry.sandboxPid,
        pidStartTime: readProcStat(entry.sandboxPid)?.startTime ?? 0,
        upstreamHeaders,
        startedAt: new Date().toISOString(),
      };
      return entry.handle;
    } catch (cause) {
      await forceStop(entry);
      await entry.exited;
      throw new MicrovmProviderError(`instance ${spec.microvmId} did not become ready`, { cause });
    }
  }

  /** The live entry of a handle: matched by its socket, so a stale handle finds nothing. */
  const entryOf = (handle: MicrovmHandle): Tracked | undefined => {
    for (const entry of tracked.values()) {
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
    await entry.cgroup.thaw().catch(() => undefined);
    // SIGTERM to the runtime only: the sandbox's init ignores it, and its death would SIGKILL all.
    for (const pid of entry.cgroup.pids()) {
      if (pid > 1 && readProcStat(pid)?.ppid === entry.sandboxPid) sendSignal(pid, "SIGTERM");
    }
    if (await within(entry.exited, graceMs)) return;
    await forceStop(entry);
    if (!(await within(entry.exited, 5_000)))
      throw new MicrovmProviderError(`instance ${handle.microvmId} survived SIGKILL`);
  }

  /**
   * SIGKILL to the sandbox's init ends its whole PID namespace and lets bwrap reap it (a
   * process orphaned to this machine's init may never be reaped); the group kill catches the rest.
   */
  async function forceStop(entry: Tracked): Promise<void> {
    await entry.cgroup.thaw().catch(() => undefined);
    if (entry.sandboxPid !== undefined && entry.sandboxPid > 1) sendSignal(entry.sandboxPid, "SIGKILL");
    if (await within(entry.exited, 1_000)) return;
    await entry.cgroup.kill().catch(() => undefined);
    entry.child.kill("SIGKILL");
  }

  return {
    name: "sandbox",
    cgroupVersion: cgroups.version,
    start,
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
    live: () => [...tracked.values()].flatMap((entry) => (entry.handle && !entry.done ? [entry.handle] : [])),
    cgroupOf: (handle) => entryOf(handle)?.cgroup,
    prepare: (images) => bundles.prepare(images),
    async reclaim() {
      const killed: ReclaimedInstance[] = [];
      for (const group of cgroups.existing()) {
        if (tracked.has(group.name)) continue;
        const pids = group.pids();
        await group.kill();
        await group.remove();
        if (pids.length > 0) killed.push({ pids });
      }
      return killed;
    },
    async close() {
      closed = true;
      await bundles.close();
      await Promise.all(
        [...tracked.values()].map(async (entry) => {
          entry.stopping = true;
          if (entry.handle) await terminate(entry.handle, 500).catch(() => undefined);
          await forceStop(entry);
          await entry.exited;
        }),
      );
      if (bundles.madeDir) await rm(await bundles.madeDir, { recursive: true, force: true });
      await cgroups.remove();
    },
  };
}

/** `/proc/<pid>/root/run/microvm/runtime.sock`: the socket inside the sandbox's own /run. */
function socketOf(sandboxPid: number): string {
  return `/proc/${sandboxPid}/root${SANDBOX_PATHS.socket}`;
}

/**
 * Starts bwrap inside the instance's cgroup: a shell (as root when the host is) writes its
 * own pid to each group's `cgroup.procs`, drops to the sandbox's host uid, then becomes bwrap.
 */
function spawnSandbox(
  options: SandboxProviderOptions,
  cgroup: InstanceCgroup,
  fileFds: readonly number[],
  bwrapArgs: string[],
): ChildProcess {
  const asRoot = process.getuid?.() === 0;
  const uid = String(options.hostUid ?? 65534);
  const drop = asRoot ? ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "--"] : [];
  const script = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"';
  const child = spawn(
    "/bin/sh",
    ["-c", script, "microvm-sandbox", ...cgroup.procsFiles, "--", ...drop, options.bwrap ?? "bwrap", ...bwrapArgs],
    {
      stdio: ["pipe", "pipe", "pipe", "pipe", ...fileFds],
      env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
    },
  );
  child.stdin?.on("error", () => undefined);
  child.on("error", () => undefined);
  return child;
}

/** Reads bwrap's info JSON (`{"child-pid": N}`) from its info fd: a channel image code cannot write. */
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

function sandboxPidOf(
  child: ChildProcess,
  deadline: number,
  signal: AbortSignal | undefined,
  stderrTail: string[],
): Promise<number> {
  const info = child.stdio[INFO_FD] as Readable | null;
  return new Promise((resolve, reject) => {
    let text = "";
    const timer = setTimeout(
      () => finish(new Error("timed out waiting for the sandbox to start")),
      Math.max(0, deadline - Date.now()),
    );
    const onData = (chunk: Buffer) => {
      text += chunk.toString();
      if (text.length > 4096) return finish(new Error("unexpected sandbox info"));
      const pid = /"child-pid"\s*:\s*(\d+)/.exec(text)?.[1];
      if (pid !== undefined) finish(undefined, Number(pid));
    };
    const onExit = (code: number | null, sig: NodeJS.Signals | null) => {
      const tail = stderrTail.join("\n");
      finish(new Error(`sandbox exited (${sig ?? `code ${code}`}) before it started${tail ? `:\n${tail}` : ""}`));
    };
    const onAbort = () => finish(new Error("start aborted"));
    function finish(error: Error | undefined, pid?: number) {
      clearTimeout(timer);
      info?.off("data", onData);
      child.off("exit", onExit);
      signal?.removeEventListener("abort", onAbort);
      if (error) reject(error);
      else resolve(pid as number);
    }
    if (!info) return finish(new Error("no info pipe"));
    if (signal?.aborted) return onAbort();
    info.on("data", onData);
    info.on("error", () => undefined);
    child.once("exit", onExit);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function sendSignal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone already.
  }
}

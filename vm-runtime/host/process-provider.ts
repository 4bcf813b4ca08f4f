// The default provider: each instance is a `node` process in its own process group, running
// its bundled image under Node's permission model with a scrubbed environment and memory caps.
// Suspend = SIGSTOP to the group, resume = SIGCONT, terminate = SIGTERM then SIGKILL.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { IMAGE_MODULE_ENV } from "./bundle.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";
import { isProcessAlive, readProcStat } from "./proc.ts";
import { INSTANCE_MARKER, instanceProcessesUnder, killProcessGroup } from "./process-reclaim.ts";
import { bundleCache, pollUntil, safeName, within } from "./provider-util.ts";
import { waitForExit, waitForHealth, waitForReadyLine, watchOutput, type OutputSink } from "./process-io.ts";
import {
  MicrovmProviderError,
  RUNTIME_PORT,
  type MicrovmHandle,
  type MicrovmProvider,
  type MicrovmSpec,
  type ReclaimedInstance,
} from "./provider.ts";

export { INSTANCE_MARKER };

export interface ProcessProviderOptions {
  /** V8 heap cap in MiB (`--max-old-space-size`), default 256; off-heap memory gets 256 MiB more. */
  readonly memoryMiB?: number;
  /** How long an instance may take to answer its first probe (default 15 s). */
  readonly startTimeoutMs?: number;
  /** How long a resumed instance may take to answer again (default 5 s). */
  readonly resumeTimeoutMs?: number;
  /** Parent of bundles and scratch directories (default: a fresh directory in the OS tmpdir). */
  readonly workDir?: string;
  /** Node's permission model (no fs outside the instance, no child processes); default true. */
  readonly permissions?: boolean;
  /** Receives every line an instance prints (default: dropped). */
  readonly onOutput?: OutputSink;
}

/** The process provider, plus what tests and shutdown need. */
export interface ProcessProvider extends MicrovmProvider {
  /** Handles of instances started by this provider whose process has not exited. */
  live(): MicrovmHandle[];
  /** Bundles these images now (one at a time), so a first start does not wait for esbuild; rejects with the first failure. */
  prepare(images: readonly string[]): Promise<void>;
  /** Kills every live instance and removes the work directory. */
  close(): Promise<void>;
  reclaim(): Promise<ReclaimedInstance[]>;
}

interface Tracked {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
  handle?: MicrovmHandle;
}

const OFF_HEAP_HEADROOM_MIB = 256;
const SAFE_PATH = "/usr/local/bin:/usr/bin:/bin";
/** Sets the data-segment limit (bounds off-heap memory too), then becomes node: same pid. */
const LIMIT_SCRIPT = 'ulimit -d "$1" || exit 97; shift; exec "$@"';

export function createProcessProvider(options: ProcessProviderOptions = {}): ProcessProvider {
  const tracked = new Map<number, Tracked>();
  const bundles = bundleCache(options.workDir, `${INSTANCE_MARKER}-`);
  const ensureWorkDir = bundles.workDir;
  const killAllNow = () => {
    for (const pid of tracked.keys()) signalGroup(pid, "SIGKILL");
  };
  process.on("exit", killAllNow);

  async function start(spec: MicrovmSpec, signal?: AbortSignal): Promise<MicrovmHandle> {
    const files = await bundles.bundle(spec.image).catch((cause: unknown) => {
      throw new MicrovmProviderError(`cannot build image ${spec.image}`, { cause });
    });
    const scratch = join(
      await ensureWorkDir(),
      "instances",
      `${safeName(spec.microvmId)}-${randomBytes(4).toString("hex")}`,
    );
    await mkdir(scratch, { recursive: true, mode: 0o700 });
    const memoryMiB = spec.memoryMiB ?? options.memoryMiB ?? 256;
    const upstreamHeaders = { [INSTANCE_SECRET_HEADER]: randomBytes(24).toString("base64url") };
    const child = spawnInstance({
      ...files,
      scratch,
      memoryMiB,
      microvmId: spec.microvmId,
      permissions: options.permissions ?? true,
      secret: upstreamHeaders[INSTANCE_SECRET_HEADER],
    });
    const pid = child.pid;
    if (pid === undefined) {
      await rm(scratch, { recursive: true, force: true });
      throw new MicrovmProviderError("instance process did not start");
    }
    const pidStartTime = readProcStat(pid)?.startTime ?? 0;
    const entry: Tracked = { child, exited: waitForExit(child) };
    tracked.set(pid, entry);
    void entry.exited.then(() => {
      tracked.delete(pid);
      return rm(scratch, { recursive: true, force: true });
    });
    const deadline = Date.now() + (options.startTimeoutMs ?? 15_000);
    let port: number;
    try {
      const stderr = watchOutput(child, spec.microvmId, options.onOutput);
      // The runtime binds a port of its own choosing and announces it: a port picked here and
      // bound there later could be taken in between.
      port = await waitForReadyLine(child, deadline, signal, stderr);
      await waitForHealth({ host: "127.0.0.1", port }, deadline, upstreamHeaders, signal);
    } catch (cause) {
      signalGroup(pid, "SIGKILL");
      await entry.exited;
      throw new MicrovmProviderError(`instance ${spec.microvmId} did not become ready`, { cause });
    }
    entry.handle = {
      microvmId: spec.microvmId,
      provider: "process",
      host: "127.0.0.1",
      ports: { [String(RUNTIME_PORT)]: port },
      upstreamHeaders,
      pid,
      pidStartTime,
      startedAt: new Date().toISOString(),
    };
    return entry.handle;
  }

  async function suspend(handle: MicrovmHandle): Promise<void> {
    const pid = ownedPid(handle);
    signalGroup(pid, "SIGSTOP");
    if (!(await pollUntil(() => readProcStat(pid)?.state === "T", 2_000))) {
      throw new MicrovmProviderError(`instance ${handle.microvmId} did not stop`);
    }
  }

  async function resume(handle: MicrovmHandle): Promise<void> {
    const pid = ownedPid(handle);
    signalGroup(pid, "SIGCONT");
    const port = handle.ports[String(RUNTIME_PORT)];
    if (port === undefined) return;
    try {
      await waitForHealth(
        { host: handle.host, port },
        Date.now() + (options.resumeTimeoutMs ?? 5_000),
        handle.upstreamHeaders,
      );
    } catch (cause) {
      throw new MicrovmProviderError(`instance ${handle.microvmId} did not answer after resume`, { cause });
    }
  }

  async function terminate(handle: MicrovmHandle, graceMs = 2_000): Promise<void> {
    const pid = handle.pid;
    if (pid === undefined || !isProcessAlive(pid, handle.pidStartTime)) return;
    const exited = () => gone(pid, handle.pidStartTime);
    signalGroup(pid, "SIGCONT");
    signalGroup(pid, "SIGTERM");
    if (await within(exited(), graceMs)) return;
    signalGroup(pid, "SIGKILL");
    if (!(await within(exited(), 5_000)))
      throw new MicrovmProviderError(`instance ${handle.microvmId} survived SIGKILL`);
  }

  /** Resolves when the process is gone: the child's exit when we started it, else /proc. */
  function gone(pid: number, startTime?: number): Promise<void> {
    const entry = tracked.get(pid);
    if (entry) return entry.exited;
    return pollUntil(() => !isProcessAlive(pid, startTime), 60_000).then(() => undefined);
  }

  return {
    name: "process",
    start,
    suspend,
    resume,
    terminate,
    isAlive: async (handle) => handle.pid !== undefined && isProcessAlive(handle.pid, handle.pidStartTime),
    live: () => [...tracked.values()].flatMap((entry) => (entry.handle ? [entry.handle] : [])),
    async reclaim() {
      if (!options.workDir) return [];
      const leaders = instanceProcessesUnder(options.workDir).filter((pid) => !tracked.has(pid));
      await Promise.all(leaders.map(killProcessGroup));
      return leaders.map((pid) => ({ pids: [pid] }));
    },
    prepare: (images) => bundles.prepare(images),
    async close() {
      process.off("exit", killAllNow);
      await bundles.close();
      await Promise.all(
        [...tracked.values()].map(async (entry) => {
          if (entry.handle) await terminate(entry.handle, 500).catch(() => undefined);
          else if (entry.child.pid !== undefined) signalGroup(entry.child.pid, "SIGKILL");
          await entry.exited;
        }),
      );
      if (bundles.madeDir) await rm(await bundles.madeDir, { recursive: true, force: true });
    },
  };
}

interface InstanceLaunch {
  /** The runtime bundle and the image module it imports. */
  readonly runtime: string;
  readonly module: string;
  /** The instance's private directory: HOME, TMPDIR, cwd, the only writable place. */
  readonly scratch: string;
  readonly memoryMiB: number;
  readonly microvmId: string;
  readonly permissions: boolean;
  /** Required on every request (the proxy adds it), so other local processes cannot call in. */
  readonly secret: string;
}

function spawnInstance({
  runtime,
  module,
  scratch,
  memoryMiB,
  microvmId,
  permissions,
  secret,
}: InstanceLaunch): ChildProcess {
  const nodeArgs = [
    "--no-warnings",
    `--max-old-space-size=${memoryMiB}`,
    // Measured: 1-4 MiB less per instance at no cost to RPC latency (a small young generation,
    // no V8 helper threads). --jitless/--lite-mode would break fetch in images on Node 20.
    "--max-semi-space-size=1",
    "--single-threaded",
    ...(permissions
      ? [
          "--experimental-permission",
          `--allow-fs-read=${runtime}`,
          `--allow-fs-read=${module}`,
          `--allow-fs-read=${scratch}`,
          `--allow-fs-write=${scratch}`,
        ]
      : []),
    runtime,
  ];
  const dataLimitKiB = (memoryMiB + OFF_HEAP_HEADROOM_MIB) * 1024;
  const child = spawn(
    "/bin/sh",
    ["-c", LIMIT_SCRIPT, INSTANCE_MARKER, String(dataLimitKiB), process.execPath, ...nodeArgs],
    {
      detached: true,
      cwd: scratch,
      stdio: ["pipe", "pipe", "pipe"],
      env: {
        PATH: SAFE_PATH,
        HOME: scratch,
        TMPDIR: scratch,
        LANG: "C.UTF-8",
        NODE_ENV: "production",
        MICROVM_ID: microvmId,
        MICROVM_RUNTIME_PORT: "0",
        [IMAGE_MODULE_ENV]: module,
      },
    },
  );
  child.stdin?.write(`${secret}\n`);
  // The runtime exits when this pipe closes (the host died); writes never happen.
  child.stdin?.on("error", () => undefined);
  // A failed spawn surfaces as a missing pid or an early exit; unhandled, it would crash the host.
  child.on("error", () => undefined);
  return child;
}

function ownedPid(handle: MicrovmHandle): number {
  if (handle.pid === undefined || !isProcessAlive(handle.pid, handle.pidStartTime)) {
    throw new MicrovmProviderError(`instance ${handle.microvmId} is not running`);
  }
  return handle.pid;
}

/** Signals the whole process group led by `pid`; a group already gone is not an error. */
function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ESRCH") throw error;
  }
}

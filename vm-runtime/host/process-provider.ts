// The default provider: each instance is a `node` process in its own process group, running
// its bundled image under Node's permission model with a scrubbed environment and memory caps.
// Suspend = SIGSTOP to the group, resume = SIGCONT, terminate = SIGTERM then SIGKILL.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { IMAGE_MODULE_ENV } from "./bundle.ts";
import { hostNode, runtimeNodeArgs, type InstanceNode } from "./node-args.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";
import { isProcessAlive, readProcStat } from "./proc.ts";
import { INSTANCE_MARKER, instanceProcessesUnder, killProcessGroup } from "./process-reclaim.ts";
import { bundleCache, pollUntil, safeName, within } from "./provider-util.ts";
import { exitOf, startFailed } from "./start-failure.ts";
import {
  outputDrained,
  waitForExit,
  waitForHealth,
  waitForReadyLine,
  withinImageShare,
  watchOutput,
  type OutputSink,
} from "./process-io.ts";
import {
  MicrovmHostError,
  MicrovmProviderError,
  RUNTIME_PORT,
  type MicrovmHandle,
  type MicrovmProvider,
  type MicrovmSpec,
  type ReclaimedInstance,
} from "./provider.ts";

export { INSTANCE_MARKER };

export interface ProcessProviderOptions {
  /**
   * V8 heap cap in MiB (`--max-old-space-size`), default 256; the data limit adds 256 MiB
   * (+ 512 on Node 24: `dataLimitMiB`).
   */
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
  /** The node binary instances run and its version (default: the host's own). */
  readonly node?: InstanceNode;
}

/** The process provider, plus what tests and shutdown need. */
export interface ProcessProvider extends MicrovmProvider {
  /** Handles of instances started by this provider whose process has not exited. */
  live(): MicrovmHandle[];
  /**
   * Bundles these images now (one at a time), so a first start does not wait for esbuild;
   * rejects with the first failure.
   */
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
/**
 * V8's code range as Node 24 maps it at start: 510 MiB writable (rwx), which `ulimit -d`
 * counts though little of it is ever touched (20 and 22 reserve it inaccessible: not counted).
 * Measured: node 24.21 needs a data limit of 563 MiB to start at any heap size, 20 and 22 51-55 MiB.
 */
const CODE_RANGE_MIB = 512;
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
      node: options.node ?? hostNode(),
      scratch,
      memoryMiB,
      microvmId: spec.microvmId,
      permissions: options.permissions ?? true,
      secret: upstreamHeaders[INSTANCE_SECRET_HEADER],
    });
    const pid = child.pid;
    if (pid === undefined) {
      await rm(scratch, { recursive: true, force: true });
      throw new MicrovmHostError("the host could not start an instance's process");
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
    const output = watchOutput(child, spec.microvmId, options.onOutput);
    try {
      // The runtime binds a port of its own choosing and announces it: a port picked here and
      // bound there later could be taken in between.
      port = await withinImageShare(
        output,
        { hostDeadline: deadline, imageTimeoutMs: spec.imageTimeoutMs, signal, exited: entry.exited },
        async (readyBy, readySignal) => {
          const announced = await waitForReadyLine(child, readyBy, readySignal, output);
          await waitForHealth({ host: "127.0.0.1", port: announced }, readyBy, upstreamHeaders, readySignal);
          return announced;
        },
      );
    } catch (cause) {
      // How it ended by itself, if it did: after the kill below, it ended by the kill.
      const exit = exitOf(child);
      signalGroup(pid, "SIGKILL");
      await entry.exited;
      await outputDrained(child, 1_000);
      if (output.booted) {
        const secret = upstreamHeaders[INSTANCE_SECRET_HEADER];
        throw startFailed(spec.microvmId, {
          cause,
          exit,
          stderr: { tail: output.stderrTail, errors: output.stderrErrors },
          secret,
        });
      }
      // node or the runtime never came up: nothing of the image ran.
      throw new MicrovmHostError(`the host could not start instance ${spec.microvmId}'s runtime`, {
        cause,
        timedOut: Date.now() >= deadline || signal?.aborted === true,
        stderr: output.stderrTail.join("\n"),
      });
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
  readonly node: InstanceNode;
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
  node,
  scratch,
  memoryMiB,
  microvmId,
  permissions,
  secret,
}: InstanceLaunch): ChildProcess {
  const nodeArgs = runtimeNodeArgs({
    nodeVersion: node.version,
    heapMiB: memoryMiB,
    permissions,
    readable: [runtime, module, scratch],
    writable: [scratch],
    entry: runtime,
  });
  const dataLimitKiB = dataLimitMiB(memoryMiB, node.version) * 1024;
  const child = spawn("/bin/sh", ["-c", LIMIT_SCRIPT, INSTANCE_MARKER, String(dataLimitKiB), node.path, ...nodeArgs], {
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
  });
  child.stdin?.write(`${secret}\n`);
  // The runtime exits when this pipe closes (the host died); writes never happen.
  child.stdin?.on("error", () => undefined);
  // A failed spawn surfaces as a missing pid or an early exit; unhandled, it would crash the host.
  child.on("error", () => undefined);
  return child;
}

/** The data-segment limit (`ulimit -d`) of an instance of `memoryMiB` heap on node `nodeVersion`. */
export function dataLimitMiB(memoryMiB: number, nodeVersion = process.versions.node): number {
  const codeRange = Number(nodeVersion.split(".")[0]) >= 24 ? CODE_RANGE_MIB : 0;
  return memoryMiB + OFF_HEAP_HEADROOM_MIB + codeRange;
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

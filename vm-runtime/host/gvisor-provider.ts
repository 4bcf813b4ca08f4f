// The gVisor provider: each instance in a `runsc` sandbox, a user-space kernel between image
// code and the host's, with no network, a read-only root of node and the image, its own host
// uid, inside its cgroup (isolated-provider.ts has what it shares with the bubblewrap sandbox).
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, statSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { isAbsolute, join } from "node:path";
import { promisify } from "node:util";
import { prepareGvisorBundle, runscFlags } from "./gvisor-command.ts";
import {
  createIsolatedProvider,
  type IsolatedProvider,
  type IsolatedProviderOptions,
  type InstanceLaunch,
  type Launched,
  type Launcher,
} from "./isolated-provider.ts";
import { spawnInCgroup } from "./isolated-spawn.ts";
import { CHECKPOINT_SIGNAL } from "../wire/rpc.ts";
import type { InstanceCgroup } from "./cgroups.ts";
import { hostNode, trialNodeFlags, type InstanceNode } from "./node-args.ts";
import { sharedLibraries } from "./sandbox-command.ts";
import { VM_RUNTIME_DIR } from "./source-dir.ts";

const run = promisify(execFile);

export interface GvisorProviderOptions extends IsolatedProviderOptions {
  /** The runsc binary (default: `findRunsc()`). */
  readonly runsc?: string;
}

export type GvisorProvider = IsolatedProvider;

/** Every gVisor instance's `runsc run` command line contains this (its container id's prefix). */
export const GVISOR_MARKER = "microvm-instance-";

/**
 * What the Sentry, the gofer and `runsc run` need beside node: memory in MiB, and host threads
 * (measured: 47 tasks in the cgroup of an idle instance; the instance's own processes and
 * threads are bounded inside by RLIMIT_NPROC).
 */
const GVISOR_OVERHEAD_MIB = 64;
const GVISOR_OVERHEAD_PIDS = 96;

export async function createGvisorProvider(options: GvisorProviderOptions): Promise<GvisorProvider> {
  return createIsolatedProvider(
    options,
    gvisorLauncher(options.runsc ?? findRunsc() ?? "runsc", options.node ?? hostNode()),
  );
}

/** `MICROVM_RUNSC`, else the copy `npm install` fetched into `.tools/`, else `runsc` on PATH. */
export function findRunsc(env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (env.MICROVM_RUNSC) return env.MICROVM_RUNSC;
  const fetched = join(VM_RUNTIME_DIR, "..", ".tools", "runsc", "usr", "bin", "runsc");
  if (existsSync(fetched)) return fetched;
  for (const dir of (env.PATH ?? "").split(":")) {
    if (dir && existsSync(join(dir, "runsc"))) return join(dir, "runsc");
  }
  return undefined;
}

function gvisorLauncher(runsc: string, node: InstanceNode): Launcher {
  const libraries = sharedLibraries(node.path);
  return {
    name: "gvisor",
    overheadMiB: GVISOR_OVERHEAD_MIB,
    overheadPids: GVISOR_OVERHEAD_PIDS,
    needs: [...(isAbsolute(runsc) ? [runsc] : []), node.path, ...libraries.map(([, host]) => host)],
    launch: (instance) => launchWall(runsc, node, libraries, instance),
    restore: (instance, imageDir) => launchWall(runsc, node, libraries, instance, imageDir),
  };
}

/**
 * How long `runsc checkpoint` may take: it writes the instance's memory, so 30 s plus 100 ms per
 * MiB the instance may hold (at least 10 MiB/s on a busy disk; 81 s for 512 MiB).
 */
const checkpointTimeoutMs = (instance: InstanceLaunch) =>
  30_000 + 100 * (instance.heapMiB + Math.ceil(instance.scratchBytes / (1024 * 1024)));
const STATE_POLL_MS = 10;

/** `runsc run` of a new instance, or `runsc restore` of one from `restoreFrom`. */
async function launchWall(
  runsc: string,
  node: InstanceNode,
  libraries: readonly (readonly [string, string])[],
  instance: InstanceLaunch,
  restoreFrom?: string,
): Promise<Launched> {
  if (instance.uid === undefined) throw new Error("the gVisor provider needs root (runsc)");
  const stateDir = join(instance.dir, "state");
  const bundleDir = join(instance.dir, "bundle");
  await Promise.all([mkdir(stateDir, { mode: 0o700 }), mkdir(bundleDir, { mode: 0o700 })]);
  const containerId = `${GVISOR_MARKER}${instance.name}`;
  const args = prepareGvisorBundle({
    runsc,
    stateDir,
    bundleDir,
    containerId,
    node,
    libraries,
    runtimeFile: instance.runtimeFile,
    socketDir: instance.socketDir,
    uid: instance.uid,
    scratchBytes: instance.scratchBytes,
    heapMiB: instance.heapMiB,
    cpus: instance.cpus,
    pids: instance.pids,
    permissions: instance.permissions,
    launchTemplate: instance.launchTemplate,
    ...(instance.cgroup.path === undefined ? {} : { cgroupsPath: instance.cgroup.path }),
    ...(restoreFrom === undefined ? {} : { restoreFrom }),
  });
  // runsc run dies with this host (bubblewrap's --die-with-parent), and the sandbox with it (--attached).
  const child = spawnInCgroup(instance.cgroup, ["setpriv", "--pdeathsig", "KILL", "--", runsc, ...args]);
  const runscCommand = (timeout: number, ...command: string[]) =>
    run(runsc, [...runscFlags(stateDir), ...command], { timeout });
  const ended = () => child.exitCode !== null || child.signalCode !== null;
  return {
    child,
    // Up once runsc has made its sandbox: until then it reads the instance's cgroup by its name
    // (its memory cap and CPUs), which a wall assigned to its instance is renamed from.
    ready: (deadline, signal) =>
      sandboxMade(instance.cgroup, ended, deadline, signal ?? AbortSignal.timeout(deadline - Date.now())),
    pid: () => child.pid,
    // runsc delivers the signal to the container's init: the runtime.
    stop: () => runscCommand(5_000, "kill", containerId, "SIGTERM").then(() => undefined),
    kill: () => instance.cgroup.kill(),
    signalRuntime: () => runscCommand(5_000, "kill", containerId, CHECKPOINT_SIGNAL).then(() => undefined),
    // runsc saves the sandbox (memory, the scratch tmpfs) and ends it. Uncompressed: runsc's own
    // flate cost more than the snapshot store's gzip of the same pages (the sandbox image, 15
    // interleaved runs: checkpoint 476 -> 148 ms, restore until running 521 -> 334 ms).
    checkpoint: (imageDir) =>
      runscCommand(
        checkpointTimeoutMs(instance),
        "checkpoint",
        "--compression=none",
        `--image-path=${imageDir}`,
        containerId,
      ).then(() => undefined),
    async running(deadline, signal) {
      for (;;) {
        signal.throwIfAborted();
        const state = await run(runsc, [...runscFlags(stateDir), "state", containerId], {
          timeout: 5_000,
          signal,
        }).then(
          ({ stdout }) => (JSON.parse(stdout) as { status?: string }).status,
          () => undefined,
        );
        if (state === "running") return;
        if (ended()) throw new Error("the wall ended while restoring");
        if (Date.now() > deadline)
          throw new Error(`the restored sandbox is not running in time (${state ?? "no state"})`);
        await new Promise((resolve) => setTimeout(resolve, STATE_POLL_MS));
      }
    },
  };
}

const SANDBOX_POLL_MS = 5;

/** Resolves once `runsc run` (or restore) has started its sandbox process in `cgroup`. */
async function sandboxMade(
  cgroup: InstanceCgroup,
  ended: () => boolean,
  deadline: number,
  signal: AbortSignal,
): Promise<void> {
  for (;;) {
    signal.throwIfAborted();
    if (cgroup.pids().some(isSandboxProcess)) return;
    // Ended before its sandbox: the start's failure is told by its exit and stderr.
    if (ended()) return;
    if (Date.now() > deadline) throw new Error("runsc did not start its sandbox in time");
    await new Promise((resolve) => setTimeout(resolve, SANDBOX_POLL_MS));
  }
}

function isSandboxProcess(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "latin1").startsWith("runsc-sandbox\0");
  } catch {
    return false;
  }
}

const CHECK_CACHE_DIR = "/run/typed-service-microvms";

/** Names the runsc and node binaries exactly as they are (path, size, change time), and the trial's flags. */
function trialKey(runsc: string): string {
  const facts = [runsc, process.execPath].map((path) => {
    const info = statSync(path);
    return `${path}:${info.size}:${info.ctimeMs}`;
  });
  return createHash("sha256")
    .update([...facts, ...trialNodeFlags()].join("\n"))
    .digest("hex")
    .slice(0, 16);
}

export type GvisorCheck = { readonly ok: true } | { readonly ok: false; readonly reason: string };

/**
 * Whether runsc runs here: one trial sandbox runs `node -e 0` under the instance's own
 * settings and node flags (a flag this node refuses fails the trial, not every instance).
 */
export async function checkGvisor(runsc = findRunsc()): Promise<GvisorCheck> {
  if (!runsc || !existsSync(runsc))
    return {
      ok: false,
      reason:
        `runsc is not installed${runsc ? ` at ${runsc}` : ""} ` +
        "(npm install fetches Debian's runsc into .tools/; or set MICROVM_RUNSC)",
    };
  if (process.getuid?.() !== 0) return { ok: false, reason: "runsc needs the microVM host to run as root" };
  // A trial that passed is remembered until the next boot (/run is a tmpfs) for this runsc and
  // node: every host start would otherwise pay for one more sandbox.
  const passed = join(CHECK_CACHE_DIR, `gvisor-ok-${trialKey(runsc)}`);
  if (existsSync(passed)) return { ok: true };
  const dir = await mkdtemp(join(tmpdir(), "gvisor-check-"));
  try {
    const stateDir = join(dir, "state");
    const bundleDir = join(dir, "bundle");
    const empty = join(dir, "empty.mjs");
    await Promise.all([mkdir(stateDir), mkdir(bundleDir), mkdir(join(dir, "run")), writeFile(empty, "")]);
    const args = prepareGvisorBundle({
      runsc,
      stateDir,
      bundleDir,
      containerId: `microvm-check-${process.pid}`,
      node: hostNode(),
      libraries: sharedLibraries(process.execPath),
      runtimeFile: empty,
      socketDir: join(dir, "run"),
      uid: 65534,
      scratchBytes: 1024 * 1024,
      heapMiB: 16,
      cpus: 1,
      pids: 16,
      permissions: false,
      args: [process.execPath, ...trialNodeFlags(), "-e", "0"],
    });
    await run(runsc, args, { timeout: 20_000 });
    await mkdir(CHECK_CACHE_DIR, { recursive: true, mode: 0o711 });
    await writeFile(passed, "");
    return { ok: true };
  } catch (error) {
    const detail =
      String((error as { stderr?: string }).stderr ?? (error as Error).message ?? "")
        .trim()
        .split("\n")
        .at(-1) ?? "";
    return { ok: false, reason: `a trial runsc sandbox failed${detail ? `: ${detail}` : ""}` };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

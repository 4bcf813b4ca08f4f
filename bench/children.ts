// Every process the benchmark starts, tracked by pid so each one is stopped at the end, on
// error and on Ctrl-C (stacks.ts starts them); the run's temporary directories, removed on exit
// too; and the clean-up a bench registers once, run once however often it is asked.
import type { ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const root = fileURLToPath(new URL("..", import.meta.url));

export interface Child {
  readonly name: string;
  readonly pid: number;
  readonly process: ChildProcess;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process has exited. */
  stop(graceMs?: number): Promise<void>;
}

const running = new Map<number, Child>();
/** Spawned and not yet ready (or failed): only a SIGKILL on exit can reach them. */
const starting = new Set<number>();

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

export function track(child: Child): Child {
  running.set(child.pid, child);
  child.process.once("exit", () => running.delete(child.pid));
  return child;
}

/** Runs `start` with `starting` holding the pid it spawns until `start` settles. */
export async function whileStarting<T>(start: (onSpawn: (pid: number) => void) => Promise<T>): Promise<T> {
  let spawned: number | undefined;
  try {
    return await start((pid) => starting.add((spawned = pid)));
  } finally {
    if (spawned !== undefined) starting.delete(spawned);
  }
}

/** The pids of the children running now (to stop only those started after, with `stopAll`). */
export function runningPids(): ReadonlySet<number> {
  return new Set(running.keys());
}

/** Stops every child still running but those in `spared`, the services before nats-server. */
export async function stopAll(graceMs = 5_000, spared: ReadonlySet<number> = new Set()): Promise<void> {
  const isNats = (child: Child) => Number(child.name.startsWith("nats-server"));
  const order = [...running.values()].filter((c) => !spared.has(c.pid)).sort((a, b) => isNats(a) - isNats(b));
  for (const child of order) await child.stop(graceMs);
}

/** Children that were started and have exited since, with how they ended. */
export function exitedChildren(children: Child[]): string[] {
  return children
    .filter((child) => exited(child.process))
    .map(
      (child) => `${child.name} (pid ${child.pid}) exited with ${child.process.exitCode ?? child.process.signalCode}`,
    );
}

/** Last resort on process exit: SIGKILL whatever is still running or starting. */
export function killAllSync(): void {
  for (const child of running.values()) {
    if (!exited(child.process)) child.process.kill("SIGKILL");
  }
  for (const pid of starting) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* already gone */
    }
  }
}

/** Stops every child on Ctrl-C or SIGTERM (twice: at once), and SIGKILLs leftovers on exit. */
export function installShutdownHandlers(onInterrupt: () => Promise<void>): void {
  let interrupted = false;
  const handler = (signal: NodeJS.Signals) => {
    if (interrupted) {
      killAllSync();
      process.exit(130);
    }
    interrupted = true;
    console.error(`\n${signal}: stopping the benchmark's processes…`);
    void onInterrupt().finally(() => process.exit(130));
  };
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
  process.on("exit", killAllSync);
}

/** `fn` run once however often it is asked (a run's own clean-up and a Ctrl-C may both ask). */
export function once<T>(fn: () => Promise<T>): () => Promise<T> {
  let running: Promise<T> | undefined;
  return () => (running ??= fn());
}

/** `cleanUp` once, on Ctrl-C or SIGTERM too; returns it for the run's own `finally`. */
export function cleanUpOnInterrupt(cleanUp: () => Promise<void>): () => Promise<void> {
  const cleanUpOnce = once(cleanUp);
  installShutdownHandlers(cleanUpOnce);
  return cleanUpOnce;
}

/** Temp directories not removed yet: removed on exit, by one listener for them all. */
const tempDirs = new Set<string>();

/** A fresh directory under the system's temp dir, removed on process exit if `remove()` was not reached. */
export async function tempDir(prefix: string): Promise<{ path: string; remove(): Promise<void> }> {
  const path = await mkdtemp(join(tmpdir(), prefix));
  if (!process.listeners("exit").includes(removeTempDirsSync)) process.on("exit", removeTempDirsSync);
  tempDirs.add(path);
  return {
    path,
    remove: async () => {
      await rm(path, { recursive: true, force: true });
      tempDirs.delete(path);
    },
  };
}

function removeTempDirsSync(): void {
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
}

// Reconcile at host start, before serving: an earlier run of this host id may have died
// (SIGKILL, crash) leaving records that say RUNNING and, for suspended instances, stopped
// processes (a running instance exits when its host's stdin pipe closes; a SIGSTOPped one
// cannot notice). Every such process is killed and every such record made TERMINATED.
import { readdirSync, readFileSync } from "node:fs";
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { INSTANCE_MARKER, isProcessAlive, readProcStat } from "../../vm-runtime/index.ts";
import { log } from "../../platform/index.ts";
import { isTerminal, terminated, type MicrovmStore } from "./store.ts";

export interface ReconcileReport {
  /** Records of this host moved to TERMINATED. */
  readonly terminated: number;
  /** Instance processes of an earlier run killed. */
  readonly killed: number;
}

/** Stated on records whose process was already gone when the host came back. */
export const REASON_PROCESS_GONE = "HostRestarted: instance process gone";
/** Stated on records whose (suspended) process outlived the host and was killed. */
export const REASON_PROCESS_KILLED = "HostRestarted: instance process killed";

export async function reconcileHost(store: MicrovmStore, hostId: string, workDir: string): Promise<ReconcileReport> {
  const mine = (await store.list()).filter(({ record }) => record.hostId === hostId && record.state !== "TERMINATED");
  const survivors = new Set<number>();
  for (const { record } of mine) {
    const pid = record.handle?.pid;
    if (pid !== undefined && isProcessAlive(pid, record.handle?.pidStartTime)) survivors.add(pid);
  }
  const orphans = new Set([...survivors, ...instanceProcessesUnder(workDir)]);
  await Promise.all([...orphans].map(killGroup));

  let count = 0;
  for (const { record } of mine) {
    if (isTerminal(record.state)) continue; // FAILED stays FAILED; its process (if any) was killed above
    const reason = record.handle?.pid !== undefined && survivors.has(record.handle.pid) ? REASON_PROCESS_KILLED : REASON_PROCESS_GONE;
    const stored = await store.update(record.microvmId, (current) =>
      current.hostId === hostId && !isTerminal(current.state) ? terminated(current, "TERMINATED", reason) : undefined,
    );
    if (stored?.record.state === "TERMINATED") count += 1;
  }
  await removeStaleBundles(workDir);
  if (count > 0 || orphans.size > 0) log.info({ hostId, terminated: count, killed: orphans.size }, "microvm host reconciled");
  return { terminated: count, killed: orphans.size };
}

/**
 * Live processes started by any earlier run of this host: the process provider runs every
 * instance from a bundle under `<workDir>/<INSTANCE_MARKER>-…`, so its command line names it.
 */
export function instanceProcessesUnder(workDir: string): number[] {
  const needle = `${workDir}/${INSTANCE_MARKER}-`;
  const pids: number[] = [];
  for (const entry of safeReaddir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const cmdline = safeRead(`/proc/${pid}/cmdline`);
    if (cmdline?.includes(needle) && isProcessAlive(pid)) pids.push(pid);
  }
  return pids;
}

/** SIGCONT first (a stopped process queues SIGKILL fine, but its group may hold others), then SIGKILL. */
async function killGroup(pid: number): Promise<void> {
  const startTime = readProcStat(pid)?.startTime;
  for (const signal of ["SIGCONT", "SIGKILL"] as const) {
    for (const target of [-pid, pid]) {
      try {
        process.kill(target, signal);
      } catch {
        // Gone already, or not a group leader.
      }
    }
  }
  const deadline = Date.now() + 5_000;
  while (isProcessAlive(pid, startTime) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  if (isProcessAlive(pid, startTime)) log.warn({ pid }, "instance process survived SIGKILL");
}

/** Bundle and scratch directories of earlier runs (the provider of this run makes its own). */
async function removeStaleBundles(workDir: string): Promise<void> {
  const entries = await readdir(workDir).catch(() => [] as string[]);
  await Promise.all(
    entries
      .filter((name) => name.startsWith(`${INSTANCE_MARKER}-`))
      .map((name) => rm(join(workDir, name), { recursive: true, force: true }).catch(() => undefined)),
  );
}

function safeReaddir(path: string): string[] {
  try {
    return readdirSync(path);
  } catch {
    return [];
  }
}

function safeRead(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

// What the process provider left behind in an earlier run: instance processes found by their
// command line (every bundle lives under `<workDir>/<INSTANCE_MARKER>-…`), killed by group.
// Pids come from /proc, never from storage; pid 1 and this process are never signalled.
import { readdirSync, readFileSync } from "node:fs";
import { isProcessAlive, readProcStat } from "./proc.ts";

/** Every instance's command line contains this (its bundle lives under such a directory). */
export const INSTANCE_MARKER = "typed-service-microvm";

/** Live instance processes started by any run of a process provider with this `workDir`. */
export function instanceProcessesUnder(workDir: string): number[] {
  const needle = `${workDir}/${INSTANCE_MARKER}-`;
  const pids: number[] = [];
  for (const entry of safeReaddir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid <= 1 || pid === process.pid) continue;
    const cmdline = safeRead(`/proc/${pid}/cmdline`);
    if (cmdline?.includes(needle) && isProcessAlive(pid)) pids.push(pid);
  }
  return pids;
}

/** SIGCONT first (a stopped group may hold others), then SIGKILL; resolves once it is gone. */
export async function killProcessGroup(pid: number): Promise<boolean> {
  if (pid <= 1 || pid === process.pid) return false;
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
  return !isProcessAlive(pid, startTime);
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

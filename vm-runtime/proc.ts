// Linux /proc readers for instance processes: run state ('R', 'S', 'T' stopped, 'Z'),
// start time (guards against pid reuse), process group and resident memory.
import { readdirSync, readFileSync } from "node:fs";

/** The fields of /proc/<pid>/stat that the provider uses. */
export interface ProcStat {
  readonly pid: number;
  /** One letter: R running, S sleeping, D disk, T stopped, t traced, Z zombie, X dead. */
  readonly state: string;
  readonly ppid: number;
  readonly pgrp: number;
  /** Clock ticks after boot at which the process started: (pid, startTime) names a process. */
  readonly startTime: number;
  readonly rssPages: number;
}

/** Reads /proc/<pid>/stat; undefined when there is no such process. */
export function readProcStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // The command name (field 2) is in parentheses and may itself contain spaces or ')'.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return {
    pid,
    state: fields[0] ?? "?",
    ppid: Number(fields[1]),
    pgrp: Number(fields[2]),
    startTime: Number(fields[19]),
    rssPages: Number(fields[21]),
  };
}

/** True while the process exists and has not exited (a zombie counts as gone). */
export function isProcessAlive(pid: number, startTime?: number): boolean {
  const stat = readProcStat(pid);
  if (!stat || stat.state === "Z" || stat.state === "X") return false;
  return startTime === undefined || stat.startTime === startTime;
}

/** Resident set size in bytes (VmRSS), or undefined when the process is gone. */
export function residentBytes(pid: number): number | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
    return match ? Number(match[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** Pids of live processes whose parent is `ppid` and whose command line contains `marker`. */
export function childProcessesWith(ppid: number, marker: string): number[] {
  const pids = readdirSync("/proc").filter((entry) => /^\d+$/.test(entry)).map(Number);
  return pids.filter((pid) => {
    const stat = readProcStat(pid);
    if (!stat || stat.ppid !== ppid || stat.state === "Z") return false;
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(marker);
    } catch {
      return false;
    }
  });
}

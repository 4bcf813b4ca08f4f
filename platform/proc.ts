// /proc/<pid>/stat: run state and start time, so that a (pid, start time) pair names one
// process even after its pid is reused (lock files, instance handles).
import { readFileSync } from "node:fs";

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

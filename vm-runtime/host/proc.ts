// Linux /proc readers for instance processes: run state ('R', 'S', 'T' stopped, 'Z'),
// start time (guards against pid reuse), process group and resident memory.
import { readdirSync, readFileSync } from "node:fs";
import { readProcStat } from "../../platform/proc.ts";

export { isProcessAlive, readProcStat, type ProcStat } from "../../platform/proc.ts";

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
  const pids = readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .map(Number);
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

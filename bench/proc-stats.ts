// Resource use of other processes from /proc: VmRSS sampled every 100 ms (peak per group)
// and CPU time as the utime+stime delta over the sampled span.
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import type { ProcessGroups, ProcessUsage } from "./types.ts";

const clockTicks = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** Resident set size in KiB; 0 when the process is gone. */
export function rssKiB(pid: number): number {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
    return match ? Number(match[1]) : 0;
  } catch {
    return 0;
  }
}

/** User + system CPU time in clock ticks (all threads); 0 when the process is gone. */
export function cpuTicks(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name, which may itself hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(fields[11]) + Number(fields[12]); // utime, stime (fields 14 and 15)
  } catch {
    return 0;
  }
}

const sum = (pids: number[], read: (pid: number) => number) => pids.reduce((total, pid) => total + read(pid), 0);
const mib = (kib: number) => Math.round((kib / 1024) * 10) / 10;

/** RSS in MiB of each group right now. */
export function currentRssMiB(groups: ProcessGroups): Record<string, number> {
  return Object.fromEntries(Object.entries(groups).map(([name, pids]) => [name, mib(sum(pids, rssKiB))]));
}

/** Starts sampling `groups`; `stop()` returns the peak RSS and the CPU used since the start. */
export function sampleUsage(groups: ProcessGroups, intervalMs = 100): { stop(): ProcessUsage } {
  const entries = Object.entries(groups);
  const cpuStart = entries.map(([, pids]) => sum(pids, cpuTicks));
  const peakKiB = entries.map(([, pids]) => sum(pids, rssKiB));
  const sample = () => {
    for (const [i, [, pids]] of entries.entries()) peakKiB[i] = Math.max(peakKiB[i]!, sum(pids, rssKiB));
  };
  const timer = setInterval(sample, intervalMs);
  return {
    stop() {
      clearInterval(timer);
      sample();
      const rssMiB: Record<string, number> = {};
      const cpuSeconds: Record<string, number> = {};
      entries.forEach(([name, pids], i) => {
        rssMiB[name] = mib(peakKiB[i]!);
        cpuSeconds[name] = Math.round(((sum(pids, cpuTicks) - cpuStart[i]!) / clockTicks) * 100) / 100;
      });
      return { rssMiB, cpuSeconds };
    },
  };
}

// What other processes and the machine use, from /proc: VmRSS sampled every 100 ms (peak per
// group) and CPU as the utime+stime delta over a span; an instance's memory (VmRSS, PSS and
// RssAnon); the machine's busy CPU (other work skews a round); live processes by command line.
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import type { ProcessGroups, ProcessUsage } from "./types.ts";

const clockTicks = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** A /proc (or /sys) file's text; "" when it (or its process) is gone. */
export function readText(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

/** The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses). */
export const statFields = (pid: number | string): string[] => {
  const stat = readText(`/proc/${pid}/stat`);
  return stat ? stat.slice(stat.lastIndexOf(")") + 2).split(" ") : [];
};

const kiBField = (text: string, name: string) =>
  Number(new RegExp(`^${name}:\\s+(\\d+)\\s+kB`, "m").exec(text)?.[1] ?? 0);

/** Resident set size in KiB; 0 when the process is gone. */
export const rssKiB = (pid: number): number => kiBField(readText(`/proc/${pid}/status`), "VmRSS");

/** User + system CPU time in clock ticks (all threads); 0 when the process is gone. */
export function cpuTicks(pid: number): number {
  const fields = statFields(pid);
  return fields.length ? Number(fields[11]) + Number(fields[12]) : 0; // utime, stime (fields 14 and 15)
}

/** CPU seconds (user + system) a process has used so far; 0 when it is gone. */
export const cpuSeconds = (pid: number): number => cpuTicks(pid) / clockTicks;

const sum = (pids: number[], pick: (pid: number) => number) => pids.reduce((total, pid) => total + pick(pid), 0);
const mib = (kib: number, n = 1) => Math.round((kib / 1024 / Math.max(1, n)) * 10) / 10;

/** RSS in MiB of each group right now. */
export function currentRssMiB(groups: ProcessGroups): Record<string, number> {
  return Object.fromEntries(Object.entries(groups).map(([name, pids]) => [name, mib(sum(pids, rssKiB))]));
}

/**
 * Starts sampling `groups`; `stop()` returns the peak RSS and the CPU used since the start, and
 * the machine's busy CPU over the same span.
 */
export function sampleUsage(groups: ProcessGroups, intervalMs = 100): { stop(): ProcessUsage } {
  const entries = Object.entries(groups);
  const machine = machineCpu();
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
      return { rssMiB, cpuSeconds, machineCpuSeconds: machine.stop() };
    },
  };
}

/** One process's memory in KiB; zeros when it is gone. */
export interface MemoryKiB {
  rss: number;
  /** Proportional set size: shared pages (the node binary, libc) divided among their users. */
  pss: number;
  /** Private anonymous pages: the V8 heap, malloc, thread stacks. */
  anon: number;
}

/** The same three figures in MiB. */
export type MemoryMiB = MemoryKiB;

export function memoryKiB(pid: number): MemoryKiB {
  const status = readText(`/proc/${pid}/status`);
  const rollup = readText(`/proc/${pid}/smaps_rollup`);
  return { rss: kiBField(status, "VmRSS"), pss: kiBField(rollup, "Pss"), anon: kiBField(status, "RssAnon") };
}

/** Sum over `pids` in MiB (one decimal), and the mean per process. */
export function memoryOf(pids: number[]): { count: number; total: MemoryMiB; each: MemoryMiB } {
  const total = { rss: 0, pss: 0, anon: 0 };
  for (const pid of pids) {
    const m = memoryKiB(pid);
    total.rss += m.rss;
    total.pss += m.pss;
    total.anon += m.anon;
  }
  const n = pids.length;
  return {
    count: n,
    total: { rss: mib(total.rss), pss: mib(total.pss), anon: mib(total.anon) },
    each: { rss: mib(total.rss, n), pss: mib(total.pss, n), anon: mib(total.anon, n) },
  };
}

/** The command line of `pid`, NULs as spaces; "" when it is gone. */
export const cmdlineOf = (pid: number | string): string => readText(`/proc/${pid}/cmdline`).replace(/\0/g, " ").trim();

/** Live processes (not zombies) whose command line contains any of `markers`, except this one. */
export function processesMentioning(markers: string[]): { pid: number; cmdline: string }[] {
  const found: { pid: number; cmdline: string }[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const cmdline = cmdlineOf(entry);
    if (!cmdline || !markers.some((marker) => cmdline.includes(marker))) continue;
    if (statFields(entry)[0] === "Z") continue;
    found.push({ pid: Number(entry), cmdline });
  }
  return found;
}

/** CPU seconds all cores have run anything since boot (not idle, iowait or steal); NaN without /proc. */
function busySeconds(): number {
  const line = readText("/proc/stat").split("\n", 1)[0];
  if (!line) return NaN;
  // cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
  const [user, nice, system, , , irq, softirq] = line.trim().split(/\s+/).slice(1).map(Number);
  return (user! + nice! + system! + irq! + softirq!) / clockTicks;
}

/** Starts counting; `stop()` returns the machine's busy CPU seconds since the start. */
function machineCpu(): { stop(): number } {
  const start = busySeconds();
  return { stop: () => Math.round((busySeconds() - start) * 100) / 100 };
}

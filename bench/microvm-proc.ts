// Memory and leftovers of microVM instance processes, from /proc: VmRSS (what the targets
// name), PSS (shared pages split among their users) and RssAnon (the private heap each
// instance really adds), plus a scan for instance processes still alive after the bench.
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { cpuTicks } from "./proc-stats.ts";

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

const field = (text: string, name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)\\s+kB`, "m").exec(text)?.[1] ?? 0);

function read(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

export function memoryKiB(pid: number): MemoryKiB {
  const status = read(`/proc/${pid}/status`);
  const rollup = read(`/proc/${pid}/smaps_rollup`);
  return { rss: field(status, "VmRSS"), pss: field(rollup, "Pss"), anon: field(status, "RssAnon") };
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
  const mib = (kib: number, n = 1) => Math.round((kib / 1024 / Math.max(1, n)) * 10) / 10;
  return {
    count: pids.length,
    total: { rss: mib(total.rss), pss: mib(total.pss), anon: mib(total.anon) },
    each: { rss: mib(total.rss, pids.length), pss: mib(total.pss, pids.length), anon: mib(total.anon, pids.length) },
  };
}

const clockTicks = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU seconds (user + system) a process has used so far; 0 when it is gone. */
export const cpuSeconds = (pid: number): number => cpuTicks(pid) / clockTicks;

/** Live processes (not zombies) whose command line contains any of `markers`, except this one. */
export function processesMentioning(markers: string[]): { pid: number; cmdline: string }[] {
  const found: { pid: number; cmdline: string }[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const cmdline = read(`/proc/${entry}/cmdline`).replace(/\0/g, " ").trim();
    if (!cmdline || !markers.some((marker) => cmdline.includes(marker))) continue;
    const stat = read(`/proc/${entry}/stat`);
    if (stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z")) continue;
    found.push({ pid: Number(entry), cmdline });
  }
  return found;
}

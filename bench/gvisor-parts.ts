// What a gVisor instance's processes are and hold, from /proc: the machine's used memory
// (MemTotal - MemAvailable), a process's PSS and its part of the instance (runsc run, gofer,
// Sentry, stub), shared by the idle-cost benches.
import { readFileSync } from "node:fs";

/** The machine's MemTotal - MemAvailable, KiB. */
export function usedKiB(): number {
  const text = readFileSync("/proc/meminfo", "utf8");
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(text)?.[1] ?? 0);
  return field("MemTotal") - field("MemAvailable");
}

/** A process's proportional set size, KiB; 0 once it is gone. */
export function pssKiB(pid: number): number {
  try {
    return Number(/^Pss:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** Which part of a gVisor instance a process is, by its command line. */
export function roleOf(pid: number): string {
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, "latin1").split("\0");
    if (argv[0] === "runsc-sandbox") return "sentry";
    if (argv[0] === "runsc-gofer") return "gofer";
    if (argv.includes("run") || argv.includes("restore")) return "runsc run";
    return argv[0] === "" ? "stub" : argv[0]!.split("/").pop()!;
  } catch {
    return "gone";
  }
}

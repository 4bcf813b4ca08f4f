// Machine-wide CPU time from /proc/stat, to tell the bench's own processes from other work on
// the machine during a round (a test suite running beside the bench skews its numbers).
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const clockTicks = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU seconds all cores have run anything since boot (not idle, iowait or steal); NaN without /proc. */
function busySeconds(): number {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!;
    // cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    const [user, nice, system, , , irq, softirq] = line.trim().split(/\s+/).slice(1).map(Number);
    return (user! + nice! + system! + irq! + softirq!) / clockTicks;
  } catch {
    return NaN;
  }
}

/** Starts counting; `stop()` returns the machine's busy CPU seconds since the start. */
export function machineCpu(): { stop(): number } {
  const start = busySeconds();
  return { stop: () => Math.round((busySeconds() - start) * 100) / 100 };
}

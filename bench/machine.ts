// What the numbers were measured on, and the exact command that measured them.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import os from "node:os";
import { natsServerPath } from "../platform/index.ts";

export interface Machine {
  cpuModel: string;
  cores: number;
  memoryGiB: number;
  node: string;
  natsServer: string;
  os: string;
  /** 1, 5 and 15 minute load averages at the start: other work on the machine skews numbers. */
  loadAverage: number[];
}

export function describeMachine(): Machine {
  const cpuinfo = (() => {
    try {
      return readFileSync("/proc/cpuinfo", "utf8");
    } catch {
      return "";
    }
  })();
  const natsServer = (() => {
    try {
      return execFileSync(natsServerPath(), ["--version"], { encoding: "utf8" }).trim();
    } catch {
      return "unknown";
    }
  })();
  return {
    cpuModel: /^model name\s*:\s*(.+)$/m.exec(cpuinfo)?.[1] ?? os.cpus()[0]?.model ?? "unknown",
    cores: os.availableParallelism(),
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    natsServer,
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    loadAverage: os.loadavg().map((l) => Math.round(l * 100) / 100),
  };
}

/** The command as typed: `npm run bench -- …` when npm ran it, else tsx. */
export function benchCommand(args: string[]): string {
  const script = process.env.npm_lifecycle_event;
  const scriptLine = process.env.npm_lifecycle_script ?? "";
  if (!script || !scriptLine.includes("bench/run.ts")) return ["tsx bench/run.ts", ...args].join(" ");
  // npm appends the caller's arguments to the script's own (`bench:growth` has --growth).
  const own = scriptLine.split(/\s+/).slice(scriptLine.split(/\s+/).indexOf("bench/run.ts") + 1);
  const extra = own.every((arg, i) => args[i] === arg) ? args.slice(own.length) : args;
  return `npm run ${script}${extra.length ? ` -- ${extra.join(" ")}` : ""}`;
}

export function formatMachine(m: Machine): string {
  return [
    `machine: ${m.cpuModel}, ${m.cores} cores, ${m.memoryGiB} GiB, ${m.os}`,
    `node ${m.node}, ${m.natsServer}, load average ${m.loadAverage.join(" ")}`,
  ].join("\n");
}

// `npm start` under a supervisor: the pid a supervisor gets is npm's, and SIGTERM or SIGINT to it
// alone (not to the process group, as a terminal's Ctrl-C does) stops the service and every
// process it started within 5 s, none orphaned.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { readdirSync, readFileSync } from "node:fs";
import { setTimeout as delay } from "node:timers/promises";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { alive, serviceDataDir } from "./helpers/process.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
/** The bound: a supervisor's stop must not need its SIGKILL. */
const STOP_MS = 5_000;

/** Every process below `pid`, read from /proc (parent pid is field 4 of /proc/<pid>/stat). */
function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue; // ended while listed
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
  }
  const found: number[] = [];
  for (let queue = [pid]; queue.length > 0; ) {
    const next = children.get(queue.shift()!) ?? [];
    found.push(...next);
    queue.push(...next);
  }
  return found;
}

function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim();
  } catch {
    return "(gone)";
  }
}

/** `npm start` in its own process group (cleaned up with SIGKILL to the group), once it is ready. */
async function npmStart(t: { after(fn: () => unknown): void }, dataDir: string) {
  const npm = spawn("npm", ["start"], {
    cwd: root,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
    env: {
      ...process.env,
      NATS_URL: "",
      DATA_DIR: dataDir,
      TASK_API_PORT: "0",
      JOB_API_PORT: "0",
      MICROVM_API_PORT: "0",
      LOG_FORMAT: "json",
      LOG_LEVEL: "info",
    },
  });
  const exited = once(npm, "exit");
  t.after(() => {
    try {
      process.kill(-npm.pid!, "SIGKILL");
    } catch {
      /* the group is gone */
    }
  });
  let output = "";
  npm.stderr!.on("data", (d) => (output += d));
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: npm.stdout! }).on("line", (line) => {
      output += `${line}\n`;
      if (line.startsWith("{") && (JSON.parse(line) as { msg?: string }).msg === "ready") resolve();
    });
    void exited.then(([code, signal]) => reject(new Error(`npm start exited (${code ?? signal}):\n${output}`)));
  });
  return { npm, exited, output: () => output };
}

describe("npm start signals", () => {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`npm start - ${signal} to npm's pid stops the service and everything it started within 5 s`, async (t) => {
      const dir = await serviceDataDir(t);
      const { npm, exited, output } = await npmStart(t, dir);
      const tree = descendants(npm.pid!);
      const commands = tree.map(commandOf);
      assert.ok(
        commands.some((c) => c.includes("nats-server")) && commands.some((c) => /^node .*(start|main)\.mjs/.test(c)),
        `the service and its nats-server run below npm: ${commands.join(" | ")}`,
      );

      const sent = Date.now();
      npm.kill(signal);
      const bound = new AbortController();
      const stopped = await Promise.race([
        exited.then(() => true),
        delay(STOP_MS, false, { signal: bound.signal }).catch(() => false),
      ]);
      bound.abort();
      const left = tree.filter(alive).map((pid) => `${pid} ${commandOf(pid)}`);
      assert.ok(stopped, `npm start still runs ${STOP_MS} ms after ${signal}:\n${output().slice(-2000)}`);
      assert.deepEqual(left, [], `still running after npm start exited (${Date.now() - sent} ms after ${signal})`);
    });
  }
});

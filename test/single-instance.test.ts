// One `npm start` per data directory, and no private nats-server outliving its service: a second
// start backs off, and SIGHUP to the group or a SIGTERM during start-up stops the server too.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { alive, runToExit, serviceDataDir, startServiceProcess } from "./helpers/process.ts";
import { postJson } from "./helpers/service.ts";

const ownNats = { NATS_URL: "" };
const natsPidOf = async (dir: string) => Number(await readFile(join(dir, "nats-server.pid"), "utf8"));

/** Waits until `pid` is gone; false if it still runs after `ms` (generous: the machine is busy). */
async function gone(pid: number, ms = 15_000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; ) {
    if (!alive(pid)) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return !alive(pid);
}

describe("single instance", () => {
  it("single instance - a second start on the same data directory says where the first runs and leaves it serving", async (t) => {
    const dir = await serviceDataDir(t);
    const first = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => first.stop("SIGKILL"));
    const natsPid = await natsPidOf(dir);

    const second = await runToExit(["main.ts"], { ...ownNats, DATA_DIR: dir });
    assert.equal(second.code, 1);
    const lines = second.stderr.trim().split("\n");
    assert.equal(lines.length, 1, second.stderr);
    assert.match(lines[0]!, /already running at (\S+) (\S+) (\S+) \(pid (\d+)\)$/);
    assert.ok(
      lines[0]!.includes(first.taskUrl) && lines[0]!.includes(first.jobUrl) && lines[0]!.includes(first.microvmUrl),
      lines[0],
    );
    assert.ok(lines[0]!.endsWith(`(pid ${first.child.pid})`), lines[0]);

    assert.ok(alive(natsPid), "the first's nats-server still runs");
    assert.equal(await natsPidOf(dir), natsPid, "its pid file is untouched");
    const created = await postJson(`${first.taskUrl}/`, { title: "still serving" });
    assert.equal(created.status, 200);
    assert.equal(await first.stop(), 0);
    assert.equal(existsSync(join(dir, "service.lock")), false, "the lock is released on exit");
  });

  it("single instance - SIGHUP to the process group (a closed terminal) stops the service and its nats-server", async (t) => {
    const dir = await serviceDataDir(t);
    const service = await startServiceProcess({ ...ownNats, DATA_DIR: dir }, [], { detached: true });
    t.after(() => service.stop("SIGKILL"));
    const natsPid = await natsPidOf(dir);
    const exit = once(service.child, "exit");
    process.kill(-service.child.pid!, "SIGHUP");
    const [code] = await exit;
    assert.equal(code, 0, "a clean shutdown");
    assert.ok(await gone(natsPid), "no nats-server left behind");
    assert.ok(service.logs.some((l) => l.msg === "shutting down" && l.signal === "SIGHUP"));
  });

  it("single instance - SIGTERM during start-up, before ready, stops the nats-server it started", async (t) => {
    const dir = await serviceDataDir(t);
    const child = spawn(process.execPath, ["--import", "tsx", "main.ts"], {
      cwd: join(import.meta.dirname, ".."),
      env: {
        ...process.env,
        ...ownNats,
        DATA_DIR: dir,
        TASK_API_PORT: "0",
        JOB_API_PORT: "0",
        MICROVM_API_PORT: "0",
        LOG_LEVEL: "info",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    t.after(() => child.kill("SIGKILL"));
    const exit = once(child, "exit");
    const messages: string[] = [];
    let readyBeforeSignal: boolean | undefined;
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const msg = (JSON.parse(line) as { msg: string }).msg;
      messages.push(msg);
      if (msg === "started private nats-server" && readyBeforeSignal === undefined) {
        readyBeforeSignal = messages.includes("ready");
        child.kill("SIGTERM");
      }
    });
    const [code] = await exit;
    assert.equal(readyBeforeSignal, false, `the signal came before ready: ${messages.join(" | ")}`);
    assert.equal(code, 0);
    assert.ok(await gone(await natsPidOf(dir)), "no nats-server left behind");
  });

  it("single instance - a SIGKILLed service's nats-server dies with it, and the next start takes over", async (t) => {
    const dir = await serviceDataDir(t);
    const first = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    const natsPid = await natsPidOf(dir);
    await first.stop("SIGKILL");
    assert.ok(await gone(natsPid), "the kernel stopped the orphan (parent-death signal)");
    const second = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => second.stop("SIGKILL"));
    assert.equal((await postJson(`${second.taskUrl}/`, { title: "after a kill" })).status, 200);
    assert.equal(await second.stop(), 0);
  });
});

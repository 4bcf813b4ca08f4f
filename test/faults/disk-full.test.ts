// The JetStream store directory runs out of space (a small tmpfs mounted for the test): creates
// answer 503 with a clear log line, nothing acknowledged is lost (also across a NATS restart
// afterwards), and the service recovers by itself once space returns. Needs root to mount; it
// is skipped, with the reason printed, where mounting is not permitted.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, open, rm, rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startNatsServer, type NatsServer } from "../../platform/index.ts";
import { lifo } from "../helpers/defer.ts";
import { firstOkAfter, lostCreates, startLoad, statusCounts } from "../helpers/load.ts";
import { skipUnlessRestartable } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Mounts a tmpfs of `size` on a new temp dir; undefined (with the reason) where that is refused. */
async function smallTmpfs(size: string): Promise<{ dir: string } | { reason: string }> {
  const dir = await mkdtemp(join(tmpdir(), "disk-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir], { stdio: "pipe" });
    return { dir };
  } catch (err) {
    await rmdir(dir);
    const detail = String((err as { stderr?: Buffer }).stderr ?? (err as Error).message)
      .trim()
      .split("\n")[0];
    return { reason: `cannot mount a tmpfs here (${detail})` };
  }
}

/** Writes zeros to `path` until the file system is full; returns the bytes written. */
async function fill(path: string): Promise<number> {
  const file = await open(path, "w");
  const chunk = Buffer.alloc(256 * 1024);
  let written = 0;
  try {
    for (;;) written += (await file.write(chunk)).bytesWritten;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
  } finally {
    await file.close().catch(() => {});
  }
  return written;
}

describe("faults: disk full", () => {
  it("disk full - creates answer 503 with a clear log line, nothing acknowledged is lost, recovery when space returns", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const mount = await smallTmpfs("64m");
    if ("reason" in mount) {
      console.log(`# skipped "${t.name}": ${mount.reason}`);
      return t.skip(mount.reason);
    }
    defer(async () => {
      execFileSync("umount", ["-l", mount.dir]);
      await rmdir(mount.dir);
    });
    const storeDir = join(mount.dir, "nats");
    let server: NatsServer = await startNatsServer({ storeDir });
    defer(() => server.stop());
    const svc = await startServiceProcess({ NATS_URL: server.url, REQUEST_TIMEOUT_MS: "2000" }, [
      "--role",
      "gateway,actors",
    ]);
    defer(() => svc.stop("SIGKILL"));

    const load = startLoad(
      [
        { url: `${svc.taskUrl}/`, body: () => ({ title: "disk" }), idOf: (a) => (a as { id: string }).id },
        { url: `${svc.jobUrl}/`, body: () => ({ content: "disk" }), idOf: (a) => a as string },
      ],
      8,
    );
    const filler = join(mount.dir, "filler");
    let full = 0;
    let freed = 0;
    let recovered = 0;
    try {
      await sleep(1_500);
      await fill(filler);
      full = Date.now();
      await sleep(3_000);
      await rm(filler);
      freed = Date.now();
      recovered = await firstOkAfter(load, freed, 15_000, "recovery after the space returned");
      await sleep(1_500);
    } finally {
      await load.stop();
    }

    // NATS restarted on the same store: what was acknowledged was written, not just cached.
    const port = server.port;
    await server.stop();
    server = await startNatsServer({ storeDir, port });
    const answers = load.answers;
    const whileFull = answers.filter((a) => a.at >= full + 500 && a.at + a.ms < freed);
    let lost = -1;
    for (let attempt = 0; attempt < 50 && lost !== 0; attempt++) {
      if (attempt > 0) await sleep(200); // the service reconnects to the restarted server
      lost = await lostCreates(answers, svc).catch(() => -1);
    }
    const fullLogs = svc.logs.filter((l) => String(l.msg).startsWith("storage full:"));
    const report = {
      requests: answers.length,
      acknowledged: answers.filter((a) => a.status === 200).length,
      lost,
      statuses: statusCounts(answers),
      whileFull: statusCounts(whileFull),
      recoveryAfterFreeMs: recovered - freed,
      storageFullLogLines: fullLogs.length,
      firstLogLine: fullLogs[0],
    };
    console.log(`# disk full: ${JSON.stringify(report)}`);
    assert.equal(lost, 0, "every acknowledged create reads back after a NATS restart");
    assert.ok(whileFull.length > 0, "creates were sent while the disk was full");
    assert.ok(
      whileFull.every((a) => a.status === 503),
      `creates answer 503 while the disk is full: ${JSON.stringify(report.whileFull)}`,
    );
    assert.equal(report.statuses["500"], undefined, "no 500s");
    assert.ok(fullLogs.length > 0, "the service logged that storage is full");
    assert.ok(fullLogs.length <= 10, `a few log lines, not one per request (${fullLogs.length})`);
  });
});

// The JetStream store directory runs out of space (a small tmpfs mounted for the test): creates
// fail with 503 (504 where nats-server answers nothing), nothing acknowledged is lost (also
// across a NATS restart afterwards), and the service recovers by itself once the store takes
// writes again: when space returns (nats-server 2.10, which also named the cause, logged once
// per 10 s), or once nats-server restarts (2.15, whose failed store stays failed, and whose own
// log names the cause). Needs root to mount; it is skipped, with the reason printed, where
// mounting is not permitted.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, open, rm, rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startNatsServer, type NatsServer } from "../../platform/index.ts";
import { lifo } from "../helpers/defer.ts";
import { failIfRequired, skipUnlessRequired } from "../helpers/invasive.ts";
import { firstOkAfter, readBackStatuses, startLoad, statusCounts } from "../helpers/load.ts";
import { skipUnlessRestartable } from "../helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "../helpers/process.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/**
 * The service's connections try again every 250 ms + up to 100 ms of jitter (platform/connect.ts):
 * back within a few tries of the restarted server being ready, on a loaded machine too.
 */
const RECONNECT_BOUND_MS = 5_000;
/**
 * nats-server says it is ready after JetStream has restored its streams, so once the service is
 * connected every read should answer at once; reads that do not (503/504) are tried again, for
 * at most this long, and counted.
 */
const READ_BACK_RETRY_MS = 5_000;
const READ_BACK_PAUSE_MS = 200;
/** How long after the space returns creates may fail before nats-server is restarted for them. */
const SELF_RECOVERY_MS = 5_000;

/** Waits until `svc` logs `msg` past its first `skip` lines; rejects after `limitMs`. */
async function untilLogged(svc: ServiceProcess, msg: string, skip: number, limitMs: number): Promise<number> {
  for (const since = Date.now(); !svc.logs.slice(skip).some((l) => l.msg === msg); await sleep(20)) {
    assert.ok(Date.now() - since < limitMs, `the service did not log "${msg}" within ${limitMs} ms`);
  }
  return Date.now();
}

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

/**
 * What nats-server 2.15 logs when a stream's store fails a write for lack of space, e.g.
 * `[ERR] Filestore [KV_tasks] Critical write error: write …/msgs/1.blk: no space left on device`.
 */
const CRITICAL_WRITE_ERROR = /\[ERR\] Filestore \[KV_(tasks|jobs)\] Critical write error: .*no space left on device/;

/** The lines `server` logs from now on (its stderr, which startNatsServer keeps draining). */
function serverLog(server: NatsServer): string[] {
  const lines: string[] = [];
  let partial = "";
  server.process.stderr!.on("data", (chunk: Buffer) => {
    const parts = (partial + chunk.toString()).split("\n");
    partial = parts.pop()!;
    lines.push(...parts);
  });
  return lines;
}

describe("faults: disk full", () => {
  it("disk full - creates fail with 503/504, nothing acknowledged is lost, recovery when the store takes writes again", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const skipUnlessRequiredHere = (reason = "") => {
      failIfRequired(t, reason);
      t.skip(reason);
    };
    if (await skipUnlessRestartable({ name: t.name, skip: skipUnlessRequiredHere })) return;
    const mount = await smallTmpfs("64m");
    if ("reason" in mount) return skipUnlessRequired(t, mount.reason);
    defer(async () => {
      execFileSync("umount", ["-l", mount.dir]);
      await rmdir(mount.dir);
    });
    const storeDir = join(mount.dir, "nats");
    let server: NatsServer = await startNatsServer({ storeDir });
    defer(() => server.stop());
    const serverLines = serverLog(server);
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
    let restartedForSpace = 0;
    try {
      await sleep(1_500);
      await fill(filler);
      full = Date.now();
      await sleep(3_000);
      await rm(filler);
      freed = Date.now();
      // nats-server 2.10 stored writes again as soon as space returned; 2.15 keeps the store of a
      // stream that failed a write for lack of space failed ("Critical write error") until it
      // restarts, and acknowledges nothing for that stream meanwhile.
      recovered = await firstOkAfter(load, freed, SELF_RECOVERY_MS, "").catch(() => 0);
      if (!recovered) {
        await server.stop();
        server = await startNatsServer({ storeDir, port: server.port });
        restartedForSpace = Date.now();
        recovered = await firstOkAfter(load, restartedForSpace, 15_000, "recovery after nats-server restarted");
      }
      await sleep(1_500);
    } finally {
      await load.stop();
    }

    // NATS restarted on the same store: what was acknowledged was written, not just cached.
    const port = server.port;
    const logsBefore = svc.logs.length;
    await server.stop();
    server = await startNatsServer({ storeDir, port });
    const restartedAt = Date.now();
    const backAt = await untilLogged(svc, "NATS connection back", logsBefore, RECONNECT_BOUND_MS);
    const answers = load.answers;
    // Sent while the disk was full; sent after, before the store took writes again.
    const whileFull = answers.filter((a) => a.at >= full + 500 && a.at < freed);
    const untilRecovered = answers.filter((a) => a.at >= freed && a.at + a.ms < recovered);
    // Each acknowledged create is read back; a 404 is a lost write (never retried), anything
    // else but 200 is read again after a pause, within READ_BACK_RETRY_MS.
    let unread = answers.filter((a) => a.status === 200);
    let [passes, notFound] = [0, 0];
    const retryStatuses: number[] = [];
    for (; unread.length > 0; passes++) {
      if (passes > 0) {
        assert.ok(
          Date.now() - backAt < READ_BACK_RETRY_MS,
          `${unread.length} acknowledged creates still unreadable ${Date.now() - backAt} ms after the reconnect ` +
            `(statuses ${[...new Set(retryStatuses)].join(", ")})`,
        );
        await sleep(READ_BACK_PAUSE_MS);
      }
      const read = await readBackStatuses(unread, svc);
      notFound += read.filter((r) => r.status === 404).length;
      const again = read.filter((r) => r.status !== 200 && r.status !== 404);
      unread = again.map((r) => r.answer);
      retryStatuses.push(...again.map((r) => r.status));
    }
    const fullLogs = svc.logs.filter((l) => String(l.msg).startsWith("storage full:"));
    const report = {
      requests: answers.length,
      acknowledged: answers.filter((a) => a.status === 200).length,
      lost: notFound,
      reconnectMs: backAt - restartedAt,
      readBack: { passes, retried: retryStatuses.length, retryStatuses: [...new Set(retryStatuses)] },
      statuses: statusCounts(answers),
      whileFull: statusCounts(whileFull),
      untilRecovered: statusCounts(untilRecovered),
      recoveryAfterFreeMs: recovered - freed,
      natsRestartedAfterFreeMs: restartedForSpace ? restartedForSpace - freed : undefined,
      storageFullLogLines: fullLogs.length,
      firstLogLine: fullLogs[0],
      serverWriteError: serverLines.find((line) => CRITICAL_WRITE_ERROR.test(line)),
    };
    console.log(`# disk full: ${JSON.stringify(report)}`);
    assert.equal(notFound, 0, "every acknowledged create reads back after a NATS restart (no 404)");
    assert.ok(whileFull.length > 0, "creates were sent while the disk was full");
    assert.equal(report.statuses["500"], undefined, "no 500s");
    assert.ok(fullLogs.length <= 10, `a few log lines, not one per request (${fullLogs.length})`);
    if (!restartedForSpace) {
      // The server answered "no space left on device": 503 at once, and the cause logged.
      const answeredWhileFull = whileFull.filter((a) => a.at + a.ms < freed);
      assert.ok(
        answeredWhileFull.every((a) => a.status === 503),
        `creates answer 503 while the disk is full: ${JSON.stringify(statusCounts(answeredWhileFull))}`,
      );
      assert.ok(fullLogs.length > 0, "the service logged that storage is full");
    } else {
      // The server acknowledged nothing for the failed store: every create timed out.
      const failed = [...whileFull.filter((a) => a.at + a.ms < recovered), ...untilRecovered];
      assert.ok(
        failed.every((a) => a.status === 503 || a.status === 504),
        `creates answer 503 or 504 until nats-server restarts: ${JSON.stringify(statusCounts(failed))}`,
      );
      // Its answers name no cause, so the service cannot: the server's own log does, once per store.
      assert.ok(
        report.serverWriteError,
        `nats-server did not log a critical write error for lack of space: ` +
          `${serverLines.filter((line) => line.includes("[ERR]")).join(" | ")}`,
      );
    }
  });
});

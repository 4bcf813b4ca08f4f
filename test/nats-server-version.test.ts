// A NATS the service joins (NATS_URL, or a node a reconnect reaches) older than 2.12 is
// refused: at start with one line naming the minimum and the version found, exit 1; on a
// reconnect the connection is closed and the owner told. The old server is Debian's
// /usr/sbin/nats-server (bookworm: 2.9.10), run here on a free port of its own.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { setTimeout as delay } from "node:timers/promises";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it, type TestContext } from "node:test";
import {
  connectNats,
  findNatsServer,
  freePort,
  natsServerPath,
  recentEnough,
  type NatsServerTooOld,
} from "../platform/index.ts";
import { runToExit, serviceDataDir } from "./helpers/process.ts";

const OLD = "/usr/sbin/nats-server";
const oldVersion = findNatsServer({ NATS_SERVER_BIN: OLD })?.version;

/** Skips `t` (with the reason) unless an older nats-server is installed at /usr/sbin. */
function oldServerOrSkip(t: TestContext): string | undefined {
  if (oldVersion && !recentEnough(oldVersion)) return oldVersion.join(".");
  t.skip(`${OLD}: ${oldVersion ? `v${oldVersion.join(".")} is current` : "not installed"}; no old server to refuse`);
  return undefined;
}

/** `binary -js` on a free port with a store of its own, until the test ends; its URL once ready. */
async function natsServer(
  t: TestContext,
  binary: string,
  port?: number,
): Promise<{ url: string; stop(): Promise<void> }> {
  const store = await mkdtemp(join(tmpdir(), "nats-version-"));
  const listen = port ?? (await freePort());
  const child = spawn(binary, ["-a", "127.0.0.1", "-p", String(listen), "-js", "-sd", store], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const exited = once(child, "exit");
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  };
  t.after(async () => {
    await stop();
    await rm(store, { recursive: true, force: true });
  });
  let output = "";
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on("data", (d: Buffer) => {
      output += d.toString();
      if (output.includes("Server is ready")) resolve();
    });
    child.once("exit", () => reject(new Error(`${binary} exited: ${output}`)));
  });
  return { url: `nats://127.0.0.1:${listen}`, stop };
}

describe("nats-server version", () => {
  it("nats-server version - npm start refuses a NATS_URL older than 2.12 with one line naming both versions, exit 1", async (t) => {
    const version = oldServerOrSkip(t);
    if (!version) return;
    const old = await natsServer(t, OLD);
    const run = await runToExit(["main.ts"], { NATS_URL: old.url, DATA_DIR: await serviceDataDir(t) });
    assert.equal(run.code, 1, run.stderr);
    const lines = run.stderr.trim().split("\n");
    assert.deepEqual(lines, [
      `error: the NATS at ${old.url.replace("nats://", "")} is nats-server ${version}, and the service needs ` +
        "2.12.0 or later (atomic batches, batch direct gets): upgrade that server",
    ]);
    assert.doesNotMatch(run.stdout + run.stderr, /\n\s+at |"stack"/, "no stack");
  });

  it("nats-server version - a reconnect that reaches an old node closes the connection and says so", async (t) => {
    const version = oldServerOrSkip(t);
    if (!version) return;
    const current = await natsServer(t, natsServerPath());
    const old = await natsServer(t, OLD);
    // nats.js picks a server of the list at random: a connection that lands on the old node is
    // refused at once (NatsServerTooOld); one on the current node is the one to test.
    let refused: NatsServerTooOld | undefined;
    const connect = () =>
      connectNats({
        servers: `${current.url},${old.url}`,
        name: "version-test",
        onServerTooOld: (err) => void (refused = err),
      });
    let handle = await connect().catch((err: Error) => err);
    for (let attempt = 1; handle instanceof Error && attempt < 30; attempt++) {
      assert.equal(handle.name, "NatsServerTooOld");
      handle = await connect().catch((err: Error) => err);
    }
    if (handle instanceof Error) throw handle;
    const open = handle;
    t.after(() => open.close());
    assert.match(handle.nc.info?.version ?? "", /^2\.(1[2-9]|[2-9]\d)\./);
    const closed = handle.nc.closed().then(() => "closed");
    await current.stop();
    // connectNats retries every 250 ms (+ up to 100 ms jitter): 10 s is dozens of attempts.
    const outcome = await Promise.race([closed, delay(10_000, "still open after 10 s")]);
    assert.equal(outcome, "closed");
    assert.equal(handle.connected(), false);
    assert.equal(refused?.version, version);
    assert.equal(refused?.server, old.url.replace("nats://", ""));
    assert.match(
      refused?.message ?? "",
      new RegExp(`is nats-server ${version.replaceAll(".", "\\.")}, and the service needs 2\\.12\\.0 or later`),
    );
  });
});

// --help, --version and unknown flags of the other commands (watch-jobs, cluster, taskctl), and
// what watch-jobs says when it starts or cannot reach NATS: one line, never a stack.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { runCli } from "../client/cli.ts";
import { connectNats, freePort, provisionBuckets } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";
import { runToExit } from "./helpers/process.ts";

const version = /^typed-task-service \d+\.\d+\.\d+$/;
const noStack = (text: string) => assert.doesNotMatch(text, /\n\s+at |"stack"/);

describe("command flags", () => {
  it("command flags - watch-jobs and cluster answer --help, --version, and an unknown flag with one line and exit 2", async () => {
    const runs = await Promise.all([
      runToExit(["client/watch-jobs-cli.ts", "--help"]),
      runToExit(["client/watch-jobs-cli.ts", "--version"]),
      runToExit(["client/watch-jobs-cli.ts", "--bogus"]),
      runToExit(["cluster/run.ts", "--help"]),
      runToExit(["cluster/run.ts", "--version"]),
      runToExit(["cluster/run.ts", "--bogus"]),
    ]);
    const [watchHelp, watchVersion, watchBogus, clusterHelp, clusterVersion, clusterBogus] = runs;
    assert.equal(watchHelp.code, 0);
    assert.match(watchHelp.stdout, /^usage: npm run watch-jobs/);
    assert.equal(clusterHelp.code, 0);
    assert.match(clusterHelp.stdout, /^usage: npm run cluster/);
    for (const run of [watchVersion, clusterVersion]) {
      assert.equal(run.code, 0);
      assert.match(run.stdout.trim(), version);
    }
    assert.deepEqual(
      [watchBogus.code, watchBogus.stderr],
      [2, "error: Unknown option '--bogus' (npm run watch-jobs -- --help)\n"],
    );
    assert.deepEqual(
      [clusterBogus.code, clusterBogus.stderr],
      [2, "error: Unknown option '--bogus' (npm run cluster -- --help)\n"],
    );
  });

  it("command flags - taskctl --version prints the version", async () => {
    let out = "";
    const code = await runCli(["--version"], { out: (text: string) => void (out += text), err: () => {}, env: {} });
    assert.equal(code, 0);
    assert.match(out, version);
  });

  it("command flags - watch-jobs with a stale .data/nats-url says which server and what to check, in one line", async (t) => {
    const dir = await mkdtemp(join(tmpdir(), "watch-stale-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const url = `nats://127.0.0.1:${await freePort()}`;
    await writeFile(join(dir, "nats-url"), url);
    const run = await runToExit(["client/watch-jobs-cli.ts"], { DATA_DIR: dir, NATS_URL: "" });
    assert.equal(run.code, 1);
    noStack(run.stderr);
    assert.equal(run.stderr.trim().split("\n").length, 1, run.stderr);
    assert.match(
      run.stderr,
      new RegExp(
        `^error: cannot reach NATS at ${url} \\(DATA_DIR=${dir}, written by npm start\\): .*is that \`npm start\` ` +
          `still running\\?`,
      ),
    );
  });

  it("command flags - watch-jobs says what it watches once the watch is set up", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const nats = await testNats(defer);
    const admin = await connectNats({ ...nats.login("admin"), name: "test-admin" });
    defer(() => admin.close());
    await provisionBuckets(admin.nc, { only: ["jobs"] });
    const child = spawn(process.execPath, ["--import", "tsx", "client/watch-jobs-cli.ts"], {
      cwd: fileURLToPath(new URL("..", import.meta.url)),
      env: { ...process.env, ...nats.env() },
      stdio: ["ignore", "pipe", "pipe"],
    });
    defer(() => child.kill("SIGKILL"));
    const first = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stderr! }).once("line", resolve);
      child.once("exit", (code) => reject(new Error(`watch-jobs exited (${code})`)));
    });
    assert.equal(first, `watching jobs created on ${nats.url} (NATS_URL); Ctrl-C to stop`);
  });
});

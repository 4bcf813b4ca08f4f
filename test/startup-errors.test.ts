// `npm start`'s command line and start-up failures: one line saying what to change, never a
// stack, and nothing left running (the private nats-server stops when start-up fails).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { chmod, readFile, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { findNatsServer, freePort, natsServerPath, OLDEST_MAINTAINED_NODE, recentEnough } from "../platform/index.ts";
import { alive, runToExit, serviceDataDir, type Exited } from "./helpers/process.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

/** Exactly one line on stderr, no stack, no fatal JSON log line. */
function oneLine(run: Exited, pattern: RegExp, code = 1): void {
  assert.equal(run.code, code, `exit code; stderr: ${run.stderr}`);
  const lines = run.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `one line on stderr, got:\n${run.stderr}`);
  assert.match(lines[0]!, pattern);
  assert.doesNotMatch(run.stdout + run.stderr, /\n\s+at |"stack"/, "no stack");
}

/** A node of a line past its end of life on this machine (`OLD_NODE`, else the system's), if any. */
function oldNode(): { path: string; version: string } | undefined {
  const path = process.env.OLD_NODE ?? "/usr/bin/node";
  const run = spawnSync(path, ["-p", "process.versions.node"], { encoding: "utf8" });
  const version = run.status === 0 ? run.stdout.trim() : "";
  return version && Number(version.split(".")[0]) < OLDEST_MAINTAINED_NODE ? { path, version } : undefined;
}

describe("start-up errors", () => {
  it("start-up errors - on a Node.js line past its end of life the service says it is not supported", async (t) => {
    const old = oldNode();
    if (!old) return t.skip(`no node older than ${OLDEST_MAINTAINED_NODE} here (OLD_NODE names one)`);
    if (Number(process.versions.node.split(".")[0]) < OLDEST_MAINTAINED_NODE)
      return t.skip(
        `the tests run on node ${process.versions.node}, itself past its end of life: nothing to compare with`,
      );
    const dir = await serviceDataDir(t);
    // A HOST that does not resolve ends the start right after the warning, before NATS.
    const env = { NATS_URL: "", DATA_DIR: dir, HOST: "nonsense.invalid" };
    const [onOld, onThis] = await Promise.all([
      runToExit(["main.ts"], env, 60_000, old.path),
      runToExit(["main.ts"], env),
    ]);
    const warning = (run: Exited) =>
      run.stdout
        .split("\n")
        .filter((line) => line.startsWith("{"))
        .map((line) => JSON.parse(line) as { level: number; msg: string })
        .find((entry) => /end of life/.test(entry.msg));
    assert.deepEqual(warning(onOld), {
      ...warning(onOld),
      level: 40,
      msg: `Node.js ${old.version} is past its end of life and not supported: use Node.js 26 (the active LTS) or 24`,
    });
    assert.equal(warning(onThis), undefined, `node ${process.versions.node} is maintained`);
    oneLine(onOld, /^error: HOST=nonsense\.invalid is not an address of this machine/);
  });

  it("start-up errors - out-of-range port, unknown LOG_LEVEL or LOG_FORMAT, unresolvable HOST and unknown flags answer one line", async (t) => {
    const dir = await serviceDataDir(t);
    const env = { NATS_URL: "", DATA_DIR: dir };
    const [port, level, host, flag, format] = await Promise.all([
      runToExit(["main.ts"], { ...env, TASK_API_PORT: "70000" }),
      runToExit(["main.ts"], { ...env, LOG_LEVEL: "verbose" }),
      runToExit(["main.ts"], { ...env, HOST: "nonsense.invalid" }),
      runToExit(["main.ts", "--bogus"], env),
      runToExit(["main.ts"], { ...env, LOG_FORMAT: "fancy" }),
    ]);
    oneLine(port, /^error: TASK_API_PORT must be a port from 0 to 65535 \(0 picks a free one\), got "70000"$/);
    oneLine(level, /^error: LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got "verbose"$/);
    oneLine(host, /^error: HOST=nonsense\.invalid is not an address of this machine .*use 127\.0\.0\.1/);
    oneLine(flag, /^error: Unknown option '--bogus' \(npm start -- --help\)$/, 2);
    oneLine(format, /^error: LOG_FORMAT must be "json" or "pretty", got "fancy"$/);
  });

  it("start-up errors - --help and --version print and exit 0 without starting anything", async (t) => {
    const dir = await serviceDataDir(t);
    const [help, version] = await Promise.all([
      runToExit(["main.ts", "--help"], { NATS_URL: "", DATA_DIR: dir }),
      runToExit(["main.ts", "--version"], { DATA_DIR: dir }),
    ]);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /^usage: npm start/);
    assert.match(help.stdout, /--role/);
    // Where env is documented, and every variable it names is documented there.
    assert.match(help.stdout, /every variable: docs\/operations\.md; the microVM host's: docs\/microvms\.md/);
    const documented =
      (await readFile(join(root, "docs/operations.md"), "utf8")) +
      (await readFile(join(root, "docs/microvms.md"), "utf8"));
    const named = help.stdout.slice(help.stdout.indexOf("env (")).match(/\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b/g) ?? [];
    assert.ok(named.length >= 10, named.join(" "));
    assert.deepEqual(
      named.filter((name) => !documented.includes(`\`${name}\``)),
      [],
      "documented in docs/operations.md or docs/microvms.md",
    );
    assert.equal(version.code, 0);
    assert.match(version.stdout.trim(), /^typed-task-service \d+\.\d+\.\d+$/);
    await assert.rejects(readFile(join(dir, "nats-server.pid")), "no nats-server was started");
  });

  it("start-up errors - a taken port names its variable, and the private nats-server stops", async (t) => {
    const dir = await serviceDataDir(t);
    const taken = createServer();
    taken.listen(0, "127.0.0.1");
    await once(taken, "listening");
    t.after(() => taken.close());
    const port = (taken.address() as { port: number }).port;
    const run = await runToExit(["main.ts"], { NATS_URL: "", DATA_DIR: dir, JOB_API_PORT: String(port) });
    oneLine(run, new RegExp(`^error: port ${port} \\(JOB_API_PORT\\) is in use.*set JOB_API_PORT to a free port`));
    const natsPid = Number(await readFile(join(dir, "nats-server.pid"), "utf8"));
    assert.equal(alive(natsPid), false, "the private nats-server stopped with the failed start");
  });

  it("start-up errors - a nats-server older than 2.12 (trixie's 2.10, bookworm's 2.9 in /usr/sbin) is named with the fix, and none starts", async (t) => {
    const dir = await serviceDataDir(t);
    const trixie = join(dir, "nats-server-2.10");
    await writeFile(trixie, '#!/bin/sh\necho "nats-server: v2.10.27"\n');
    await chmod(trixie, 0o755);
    const old = [trixie];
    // Debian's own package where it is installed (bookworm: 2.9.10).
    const debian = findNatsServer({ NATS_SERVER_BIN: "/usr/sbin/nats-server" })?.version;
    if (debian && !recentEnough(debian)) old.push("/usr/sbin/nats-server");
    else t.diagnostic(`/usr/sbin/nats-server: ${debian ? `v${debian.join(".")}, current` : "not installed"}`);
    for (const binary of old) {
      const run = await runToExit(["main.ts"], { NATS_URL: "", DATA_DIR: dir, NATS_SERVER_BIN: binary });
      const version = binary === trixie ? "2.10.27" : debian!.join(".");
      oneLine(
        run,
        new RegExp(
          `^error: nats-server >= 2\\.12 is needed, but ${binary} is v${version.replaceAll(".", "\\.")}: ` +
            "run scripts/get-nats-server\\.sh \\(Debian unstable's package into \\.tools/\\), or set " +
            "NATS_SERVER_BIN to a current binary \\(or set NATS_URL to join a running NATS\\)$",
        ),
      );
      await assert.rejects(readFile(join(dir, "nats-server.pid")), `no nats-server was started from ${binary}`);
    }
  });

  it("start-up errors - a NATS without JetStream is named with the fix", async (t) => {
    const dir = await serviceDataDir(t);
    const port = await freePort();
    const nats = spawn(natsServerPath(), ["-a", "127.0.0.1", "-p", String(port)], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    t.after(() => nats.kill("SIGKILL"));
    await new Promise<void>((resolve) =>
      nats.stderr!.on("data", (d: Buffer) => d.toString().includes("Server is ready") && resolve()),
    );
    const url = `nats://127.0.0.1:${port}`;
    const run = await runToExit(["main.ts"], { NATS_URL: url, DATA_DIR: dir });
    oneLine(run, new RegExp(`^error: the NATS at ${url} has no JetStream: run it with \`nats-server -js\``));
  });
});

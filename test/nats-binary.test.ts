// The nats-server the project runs (>= 2.12, found as NATS_SERVER_BIN, .tools/, PATH, /usr/sbin)
// and NATS_SYNC, JetStream's sync_interval: parsed, written into the config, refused at start
// with one line when invalid.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { chmod, mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import {
  MIN_NATS_SERVER,
  findNatsServer,
  natsServerPath,
  parseNatsServerVersion,
  parseNatsSync,
  recentEnough,
  startNatsServer,
} from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

/** A stand-in binary that answers `--version` with `version`. */
async function fakeNatsServer(dir: string, version: string): Promise<string> {
  const path = join(dir, `nats-server-${version}`);
  await writeFile(path, `#!/bin/sh\necho "nats-server: v${version}"\n`);
  await chmod(path, 0o755);
  return path;
}

/** `main.ts` as `npm start` runs it, with `env`; its exit code and stderr. */
async function startMain(env: Record<string, string>): Promise<{ code: number; stderr: string }> {
  const dataDir = await mkdtemp(join(tmpdir(), "main-refused-"));
  try {
    await promisify(execFile)(process.execPath, ["--import", "tsx", "main.ts"], {
      cwd: root,
      env: {
        ...process.env,
        NATS_URL: "",
        DATA_DIR: dataDir,
        TASK_API_PORT: "0",
        JOB_API_PORT: "0",
        MICROVM_API_PORT: "0",
        ...env,
      },
      timeout: 60_000,
    });
    return { code: 0, stderr: "" };
  } catch (err) {
    const e = err as { code: number; stderr: string };
    return { code: e.code, stderr: e.stderr };
  } finally {
    await rm(dataDir, { recursive: true, force: true });
  }
}

describe("nats-server binary", () => {
  it("nats-server binary - versions: 2.12 and later are recent enough; 2.9 (bookworm), 2.10 (trixie) and 2.11 are not", () => {
    assert.deepEqual(parseNatsServerVersion("nats-server: v2.15.1\n"), [2, 15, 1]);
    assert.equal(parseNatsServerVersion("command not found"), undefined);
    assert.deepEqual(MIN_NATS_SERVER, [2, 12]);
    for (const old of [
      [2, 9, 10],
      [2, 10, 27],
      [2, 11, 9],
      [1, 99, 0],
    ])
      assert.equal(recentEnough(old), false, `${old}`);
    for (const ok of [
      [2, 12, 0],
      [2, 15, 1],
      [3, 0, 0],
    ])
      assert.equal(recentEnough(ok), true, `${ok}`);
    assert.equal(recentEnough(undefined), false);
  });

  it("nats-server binary - get-nats-server.sh replaces an older binary in .tools/ with Debian unstable's, keeps a current one", async (t) => {
    const script = await readFile(join(root, "scripts/get-nats-server.sh"), "utf8");
    assert.equal(/^minimum="([\d.]+)"$/m.exec(script)?.[1], MIN_NATS_SERVER.join("."), "the script's minimum");
    if (recentEnough(findNatsServer({ PATH: "/usr/bin:/bin", NATS_SERVER_BIN: "/usr/sbin/nats-server" })?.version)) {
      t.skip("/usr/sbin/nats-server is current: the script would take it");
      return;
    }
    // A copy of the script beside a debian-fetch.sh that records its arguments and "fetches" 2.15.1.
    const dir = await mkdtemp(join(tmpdir(), "get-nats-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    await mkdir(join(dir, "scripts"));
    await writeFile(join(dir, "scripts/get-nats-server.sh"), script);
    await writeFile(
      join(dir, "scripts/debian-fetch.sh"),
      'echo "$@" >> fetched; rm -rf "$3"; mkdir -p "$3/usr/sbin"; ' +
        'printf \'#!/bin/sh\\necho "nats-server: v2.15.1"\\n\' > "$3/usr/sbin/nats-server"; ' +
        'chmod +x "$3/usr/sbin/nats-server"\n',
    );
    const tools = join(dir, ".tools/nats-server/usr/sbin");
    await mkdir(tools, { recursive: true });
    await rename(await fakeNatsServer(dir, "2.10.27"), join(tools, "nats-server"));
    const run = () =>
      promisify(execFile)("bash", [join(dir, "scripts/get-nats-server.sh")], { env: { PATH: "/usr/bin:/bin" } });
    assert.equal((await run()).stdout, `nats-server: v2.15.1 at ${join(tools, "nats-server")}\n`);
    assert.equal(
      await readFile(join(dir, "fetched"), "utf8"),
      `nats-server unstable ${join(dir, ".tools/nats-server")}\n`,
    );
    assert.equal((await run()).stdout, `nats-server: v2.15.1 at ${join(tools, "nats-server")}\n`);
    assert.equal(
      (await readFile(join(dir, "fetched"), "utf8")).split("\n").length,
      2,
      "a current one is not fetched again",
    );
  });

  it("nats-server binary - NATS_SERVER_BIN comes first; an old one is refused in one line naming the script", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const dir = await mkdtemp(join(tmpdir(), "nats-bin-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    const current = await fakeNatsServer(dir, "2.15.1");
    const old = await fakeNatsServer(dir, "2.10.27");
    assert.deepEqual(findNatsServer({ NATS_SERVER_BIN: current, PATH: "" }), {
      path: current,
      source: "NATS_SERVER_BIN",
      version: [2, 15, 1],
    });
    assert.equal(natsServerPath({ NATS_SERVER_BIN: current, PATH: "" }), current);
    assert.throws(
      () => natsServerPath({ NATS_SERVER_BIN: old, PATH: "" }),
      (err: Error) => {
        assert.equal(
          err.message,
          `nats-server >= 2.12 is needed, but ${old} is v2.10.27: run scripts/get-nats-server.sh (Debian ` +
            `unstable's package into .tools/), or set NATS_SERVER_BIN to a current binary`,
        );
        return true;
      },
    );
  });

  it("nats-server binary - a NATS_SERVER_BIN that is not there is an error, not a fallback to another binary", () => {
    assert.throws(
      () => natsServerPath({ NATS_SERVER_BIN: "/nonexistent/nats-server", PATH: process.env.PATH }),
      /^Error: NATS_SERVER_BIN names \/nonexistent\/nats-server, which is not an executable file: run scripts\/get-nats-server\.sh/,
    );
  });

  it("nats-server binary - npm start refuses an old nats-server with one line saying how to get a current one", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const dir = await mkdtemp(join(tmpdir(), "nats-bin-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    const { code, stderr } = await startMain({ NATS_SERVER_BIN: await fakeNatsServer(dir, "2.11.9") });
    assert.equal(code, 1);
    assert.equal(stderr.trim().split("\n").length, 1, stderr);
    assert.match(
      stderr,
      /^error: nats-server >= 2\.12 is needed, but .* is v2\.11\.9: run scripts\/get-nats-server\.sh/,
    );
  });
});

describe("NATS_SYNC", () => {
  it("NATS_SYNC - an interval or always; 1s by default; anything else refused", () => {
    assert.equal(parseNatsSync(undefined), "1s");
    assert.equal(parseNatsSync(""), "1s");
    for (const ok of ["always", "1s", "100ms", "2m", "1m30s", "1.5s"]) assert.equal(parseNatsSync(ok), ok);
    for (const bad of ["0s", "1", "fast", "1 s", "-1s", "ALWAYS", "1sec", "0"]) {
      assert.throws(
        () => parseNatsSync(bad),
        /^Error: NATS_SYNC must be "always" or a positive duration such as 1s, 100ms or 2m, got "/,
      );
    }
  });

  it("NATS_SYNC - npm start refuses an invalid value in one line", async () => {
    const { code, stderr } = await startMain({ NATS_SYNC: "sometimes" });
    assert.equal(code, 1);
    assert.equal(
      stderr.trim(),
      'error: NATS_SYNC must be "always" or a positive duration such as 1s, 100ms or 2m, got "sometimes"',
    );
  });

  for (const sync of ["always", "100ms"]) {
    it(`NATS_SYNC - the server starts with sync_interval ${sync} in its jetstream block`, async (t) => {
      const defer = lifo((fn) => t.after(fn));
      const storeDir = await mkdtemp(join(tmpdir(), "nats-sync-"));
      defer(() => rm(storeDir, { recursive: true, force: true }));
      const server = await startNatsServer({ storeDir, sync });
      defer(() => server.stop());
      const config = await readFile(join(storeDir, "nats-server.conf"), "utf8");
      assert.match(config, new RegExp(`^jetstream \\{ store_dir: ".*", sync_interval: "${sync}" \\}$`, "m"));
    });
  }
});

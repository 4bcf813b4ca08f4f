// taskctl and the typed client find the service through DATA_DIR: a service started with its own
// DATA_DIR on free ports is reached with only DATA_DIR set, over HTTP and over NATS; a missing
// or stale one is a hint that names DATA_DIR; credentials that a NATS refuses are one message.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { lifo } from "./helpers/defer.ts";
import { codeBlocks } from "./helpers/doc-snippets.ts";
import { serviceDataDir, startServiceProcess, type ServiceProcess } from "./helpers/process.ts";
import { runTaskctl, type CliRun } from "./helpers/taskctl.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

/** taskctl in this process with exactly `env` (no TASK_API_URL, no NATS_* unless given). */
const taskctl = (env: Record<string, string>, ...args: string[]): Promise<CliRun> => runTaskctl(args, env);

describe("cli - DATA_DIR", () => {
  let dataDir: string;
  let service: ServiceProcess;
  const defer = lifo(after);

  before(async () => {
    dataDir = await serviceDataDir({ after: defer });
    service = await startServiceProcess({ NATS_URL: "", DATA_DIR: dataDir }, ["--role", "gateway,actors"]);
    defer(() => service.stop());
  });

  it("cli - with only DATA_DIR set, taskctl reaches the APIs of the service there on its ports", async () => {
    assert.notEqual(new URL(service.taskUrl).port, "8787");
    const created = await taskctl({ DATA_DIR: dataDir }, "tasks", "create", "found by DATA_DIR", "--json");
    assert.equal(created.code, 0, created.stderr);
    const task = JSON.parse(created.stdout) as { id: string };
    // It went to this service: its own HTTP API has the task.
    const stored = await fetch(`${service.taskUrl}/${task.id}`);
    assert.equal(stored.status, 200);
    const job = await taskctl({ DATA_DIR: dataDir }, "jobs", "create", "found too", "--json");
    assert.equal(job.code, 0, job.stderr);
  });

  it("cli - --nats joins the NATS of DATA_DIR as its internal user, given its URL or none", async () => {
    const natsUrl = (await readFile(join(dataDir, "nats-url"), "utf8")).trim();
    const viaUrl = await taskctl({ DATA_DIR: dataDir }, "tasks", "create", "over NATS", "--nats", natsUrl, "--json");
    assert.equal(viaUrl.code, 0, viaUrl.stderr);
    const localhost = natsUrl.replace("127.0.0.1", "localhost");
    const viaName = await taskctl({ DATA_DIR: dataDir }, "tasks", "ls", "--nats", localhost);
    assert.equal(viaName.code, 0, viaName.stderr);
    const id = (JSON.parse(viaUrl.stdout) as { id: string }).id;
    const fromDataDir = await taskctl({ DATA_DIR: dataDir }, "tasks", "get", id, "--nats", "", "--json");
    assert.equal(fromDataDir.code, 0, fromDataDir.stderr);
    assert.equal((JSON.parse(fromDataDir.stdout) as { title: string }).title, "over NATS");
  });

  it("cli - a NATS that refuses the credentials is one message naming them and DATA_DIR, no stack", async (t) => {
    const natsUrl = (await readFile(join(dataDir, "nats-url"), "utf8")).trim();
    const elsewhere = await serviceDataDir(t);
    const refused = await taskctl({ DATA_DIR: elsewhere }, "tasks", "ls", "--nats", natsUrl);
    assert.equal(refused.code, 1);
    assert.equal(
      refused.stderr,
      `error: the NATS at ${natsUrl} refused taskctl's credentials (Authorization Violation); credentials used: ` +
        `none (DATA_DIR=${elsewhere} has no nats-url: no npm start there)\nhint: for the NATS of an \`npm start\`, ` +
        "set DATA_DIR to that service's data directory (its nats-url and nats-auth/ are read); for another NATS, " +
        "set NATS_CREDS, NATS_USER/NATS_PASSWORD or NATS_NKEY\n",
    );
  });

  it("cli - no service in DATA_DIR: the hint names DATA_DIR and its service.lock", async (t) => {
    const empty = await serviceDataDir(t);
    const missing = await taskctl({ DATA_DIR: empty }, "tasks", "get", "x");
    if (missing.code === 0 || !/cannot reach/.test(missing.stderr)) {
      t.skip(`something answers on 127.0.0.1:8787 on this machine: ${missing.stderr || missing.stdout}`);
      return;
    }
    assert.equal(missing.code, 1);
    assert.equal(
      missing.stderr,
      "error: cannot reach the Task API at http://127.0.0.1:8787 (connection refused)\n" +
        `hint: no service found in DATA_DIR=${empty} (${join(empty, "service.lock")} missing); start it with ` +
        "`npm start`, or set DATA_DIR to its data directory, or point --url or TASK_API_URL at it\n",
    );
    // A lock left by a process that is gone (a SIGKILLed service) is named as such.
    await writeFile(join(empty, "service.lock"), JSON.stringify({ pid: 2 ** 22 + 1, startTime: 1, urls: [] }));
    const stale = await taskctl({ DATA_DIR: empty }, "tasks", "get", "x");
    assert.match(stale.stderr, /names pid 4194305, which has exited\); start it with `npm start`/);
    const nats = await taskctl({ DATA_DIR: empty }, "tasks", "ls", "--nats", "");
    assert.equal(nats.code, 1);
    assert.equal(
      nats.stderr,
      `error: no service found in DATA_DIR=${empty} (${join(empty, "nats-url")} missing); start it with ` +
        "`npm start`, or set DATA_DIR to its data directory, or give --nats a URL\n",
    );
  });

  it("cli - the README's NATS script prints one line when it finds no service, and runs with DATA_DIR", async (t) => {
    const readme = await readFile(join(root, "README.md"), "utf8");
    const script = codeBlocks("README.md", readme).find((b) => b.code.includes("connectToService"));
    assert.ok(script, "the README has a script that calls connectToService");
    // Written in a directory of the test's own, its imports pointed at the checkout.
    const empty = await serviceDataDir(t);
    const file = join(empty, "hello-nats.ts");
    await writeFile(file, script.code.replaceAll('"./', `"${root}`));
    await writeFile(join(empty, "package.json"), '{ "type": "module" }');
    const run = (env: Record<string, string>) =>
      new Promise<CliRun>((resolve) =>
        execFile(
          process.execPath,
          ["--import", "tsx", file],
          { cwd: root, env: { ...process.env, NATS_URL: "", ...env }, timeout: 60_000 },
          (err, stdout, stderr) => resolve({ code: err ? Number(err.code) : 0, stdout, stderr }),
        ),
      );
    const [none, found] = await Promise.all([run({ DATA_DIR: empty }), run({ DATA_DIR: dataDir })]);
    assert.equal(none.code, 1);
    assert.equal(
      none.stderr,
      `error: no NATS to join: no service found in DATA_DIR=${empty} (${join(empty, "nats-url")} missing); ` +
        "start it with `npm start`, or set DATA_DIR to its data directory, or set NATS_URL\n",
    );
    assert.equal(found.code, 0, found.stderr);
    assert.match(found.stdout, /over NATS/);
  });
});

// taskctl as users run it: the real CLI against the service and a microVM host, over HTTP
// and NATS. Most cases call `runCli` in this process (a child process costs ~1.5 s of CPU
// here); the last two run the installed command as a child process: client/cli-bin.mjs,
// `npx taskctl` and `npm run cli`, with their exit status, stdout and stderr.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer, request } from "node:http";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { freePort } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, startMicrovmService, waitForState, type MicrovmService } from "./helpers/microvm.ts";
import { startService, type TestService } from "./helpers/service.ts";
import { runTaskctl } from "./helpers/taskctl.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command line in the repository and collects its output and exit status. */
function run(file: string, args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(file, args, { cwd: root, env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === "number" ? err.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

/** The same, in this process: what the CLI prints and the status it exits with. */
const runHere = (args: string[], env: Record<string, string>): Promise<Run> => runTaskctl(args, env);

/** An HTTP proxy in front of `target` that records each request's method and path: what the CLI sent. */
async function recordingProxy(target: string, defer: (cleanup: () => unknown) => void) {
  const seen: string[] = [];
  const server = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const upstream = request(new URL(req.url!, target), { method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode!, answer.headers);
      answer.pipe(res);
    });
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  defer(() => new Promise((resolve) => server.close(resolve)));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, seen };
}

/** A self-contained image whose module takes `ms` to load: its instances reach RUNNING that much later. */
const slowImage = (ms: number) => `
const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, fetch: () => new Response("no", { status: 404 }) });
await new Promise((resolve) => setTimeout(resolve, ${ms}));
export default defineImage({ methods: { hello: { handler: (m) => "slow " + m } } });
`;

describe("cli", () => {
  const defer = lifo(after);
  let svc: TestService;
  let vms: MicrovmService;
  let env: Record<string, string>;
  const taskctl = (...args: string[]) => runHere(args, env);
  const json = async (...args: string[]) => {
    const result = await taskctl(...args, "--json");
    assert.equal(result.code, 0, `taskctl ${args.join(" ")}: ${result.stderr}`);
    return JSON.parse(result.stdout) as Record<string, unknown> & string;
  };

  before(async () => {
    [svc, vms] = await Promise.all([startService(defer), startMicrovmService(defer, { retentionSeconds: 60 })]);
    // --nats joins as the `internal` user of the task service's NATS (its generated credentials).
    env = {
      TASK_API_URL: svc.taskUrl,
      JOB_API_URL: svc.jobUrl,
      MICROVM_API_URL: vms.microvmUrl,
      ...(svc.nats.authDir ? { NATS_AUTH_DIR: svc.nats.authDir } : {}),
    };
  });
  after(() => assertNoInstanceLeft());

  it("cli - tasks create prints the task; tasks get reads it back as text and as JSON", async () => {
    const created = await taskctl("tasks", "create", "write the docs");
    assert.equal(created.code, 0, created.stderr);
    const id = /created task (\S+)/.exec(created.stdout)?.[1];
    assert.ok(id, created.stdout);
    assert.match(created.stdout, /title\s+write the docs/);
    const text = await taskctl("tasks", "get", id);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`id\\s+${id}\\n`));
    assert.match(text.stdout, /completed\s+no/);
    assert.deepEqual(await json("tasks", "get", id), { id, title: "write the docs", completed: false });
  });

  it("cli - --name reaches the task object; a missing task is 'no task with id …', exit 1", async () => {
    const task = await json("tasks", "create", "in an object", "--name", "team-a");
    assert.deepEqual(await json("tasks", "get", String(task.id), "--name", "team-a"), task);
    const [elsewhere, unknown] = await Promise.all([
      taskctl("tasks", "get", String(task.id)),
      taskctl("tasks", "get", "no-such-id", "--name", "team-a"),
    ]);
    assert.equal(elsewhere.code, 1);
    assert.equal(elsewhere.stderr.trim(), `error: no task with id ${task.id}`);
    assert.equal(unknown.code, 1);
    assert.equal(unknown.stderr.trim(), 'error: no task with id no-such-id in task object "team-a"');
    assert.equal(unknown.stdout, "");
  });

  it("cli - tasks update, ls and rm, in the object store and a task object; --if-match refuses a moved task", async () => {
    for (const where of [[], ["--name", "cli-lists"]]) {
      const task = await json("tasks", "create", "to finish", ...where);
      const id = String(task.id);
      const done = await taskctl("tasks", "update", id, "--completed", "yes", ...where);
      assert.equal(done.code, 0, done.stderr);
      assert.match(done.stdout, /completed\s+yes/);
      const revision = /revision\s+(\d+)/.exec(done.stdout)?.[1];
      assert.ok(revision, done.stdout);
      const stale = await taskctl(
        "tasks",
        "update",
        id,
        "--title",
        "x",
        "--if-match",
        String(Number(revision) - 1),
        ...where,
      );
      assert.equal(stale.code, 1);
      assert.match(stale.stderr, /revision/);
      assert.equal((await taskctl("tasks", "update", id, "--completed", "maybe", ...where)).code, 2);
      const listed = await json("tasks", "ls", "--limit", "1000", ...where);
      assert.ok((listed.items as unknown as { id: string }[]).some((t) => t.id === id));
      const text = await taskctl("tasks", "ls", ...where);
      assert.match(text.stdout, new RegExp(`${id}  \\[x\\] to finish`));
      const removed = await taskctl("tasks", "rm", id, "--if-match", revision, ...where);
      assert.equal(removed.code, 0, removed.stderr);
      assert.equal(removed.stdout.trim(), `deleted task ${id}`);
      assert.equal((await taskctl("tasks", "get", id, ...where)).code, 1);
    }
  });

  it("cli - jobs create prints the id; jobs get reads the job; JSON is the raw answer", async () => {
    const created = await taskctl("jobs", "create", "render");
    assert.equal(created.code, 0, created.stderr);
    const id = /^created job (\S+)$/.exec(created.stdout.trim())?.[1];
    assert.ok(id, created.stdout);
    assert.deepEqual(await json("jobs", "get", id), { id, content: "render" });
    const raw = await json("jobs", "create", "another");
    assert.equal(typeof raw, "string");
    const missing = await taskctl("jobs", "get", "nope");
    assert.equal(missing.code, 1);
    assert.equal(missing.stderr.trim(), "error: no job with id nope");
  });

  it("cli - --nats calls the actors straight over NATS; the record is the one HTTP reads", async () => {
    const task = await json("tasks", "create", "over nats", "--nats", svc.nats.url);
    assert.deepEqual(await json("tasks", "get", String(task.id)), task);
    const job = await json(
      "jobs",
      "get",
      await json("jobs", "create", "x", "--nats", svc.nats.url),
      "--nats",
      svc.nats.url,
    );
    assert.equal(job.content, "x");
  });

  it("cli - an unreachable service is exit 1 with a hint to run npm start", async () => {
    const port = await freePort();
    const [http, nats] = await Promise.all([
      taskctl("tasks", "get", "x", "--url", `http://127.0.0.1:${port}`),
      taskctl("jobs", "create", "x", "--nats", `nats://127.0.0.1:${port}`),
    ]);
    assert.equal(http.code, 1);
    assert.match(
      http.stderr,
      new RegExp(`cannot reach the Task API at http://127\\.0\\.0\\.1:${port} \\(connection refused\\)`),
    );
    assert.match(http.stderr, /hint: .*`npm start`/);
    assert.equal(nats.code, 1);
    assert.match(nats.stderr, /cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+/);
    assert.match(nats.stderr, /npm start/);
  });

  it("cli - bad usage is exit 2 with a message: unknown command, missing argument, unknown option", async () => {
    const cases: [string[], RegExp][] = [
      [["nope"], /unknown command "nope"; the groups are tasks, objects, jobs, microvm, image /],
      [["tasks", "delete", "x"], /unknown command "tasks delete"[\s\S]*taskctl tasks get ID/],
      [["tasks", "get"], /tasks get needs ID/],
      [["jobs", "create"], /jobs create needs CONTENT/],
      [["tasks", "get", "a", "b"], /unexpected argument "b"/],
      [["tasks", "get", "x", "--color"], /unknown option --color for "tasks get"/],
      [["tasks", "get", "x", "--url"], /--url needs a value/],
      [["tasks", "get", "x", "--url", "http://a", "--nats", "nats://b"], /use --url or --nats, not both/],
      [["microvm", "run", "--idle", "soon"], /--idle needs a whole number, got "soon"/],
      [[], /missing command/],
    ];
    const results = await Promise.all(cases.map(([args]) => taskctl(...args)));
    results.forEach((result, i) => {
      assert.equal(result.code, 2, `${cases[i][0].join(" ")}: ${result.stderr}`);
      assert.match(result.stderr, cases[i][1]);
    });
  });

  it("cli - --help works per command and exits 0", async () => {
    const [top, group, command] = await Promise.all([
      taskctl("--help"),
      taskctl("microvm", "--help"),
      taskctl("microvm", "run", "--help"),
    ]);
    for (const r of [top, group, command]) assert.equal(r.code, 0, r.stderr);
    assert.match(top.stdout, /tasks create\s+Create a task/);
    assert.match(group.stdout, /taskctl microvm token ID \[--minutes MINUTES\] \[--port PORT\]\.\.\./);
    assert.match(command.stdout, /--no-auto-resume\s+do not resume/);
  });

  it("cli - microvm run --wait, get, token, suspend, resume, ls, terminate", async () => {
    const vm = await json("microvm", "run", "--idle", "120", "--suspended", "300", "--no-auto-resume", "--wait");
    const id = String(vm.microvmId);
    assert.equal(vm.state, "RUNNING");
    assert.deepEqual(vm.idlePolicy, {
      maxIdleDurationSeconds: 120,
      suspendedDurationSeconds: 300,
      autoResumeEnabled: false,
    });
    const got = await taskctl("microvm", "get", id);
    assert.match(got.stdout, /state\s+RUNNING/);
    assert.match(got.stdout, /policy\s+suspends after 120 s idle, terminates after 300 s suspended, auto-resume off/);
    const token = await taskctl("microvm", "token", id, "--minutes", "2", "--port", "8080", "--port", "9000-9001");
    assert.equal(token.code, 0, token.stderr);
    const header = /^X-aws-proxy-auth: (\S+)$/.exec(token.stdout.trim())?.[1];
    assert.ok(header, token.stdout);
    const hello = await fetch(`http://${vm.endpoint}/__rpc__/hello`, {
      method: "POST",
      headers: { "X-aws-proxy-auth": header },
      body: '["cli"]',
    });
    assert.equal(await hello.json(), "hello, cli!");
    assert.equal((await taskctl("microvm", "suspend", id)).stdout.trim(), `${id} SUSPENDED`);
    const again = await taskctl("microvm", "suspend", id);
    assert.equal(again.code, 1);
    assert.match(again.stderr, new RegExp(`error: microVM ${id} is SUSPENDED: `));
    assert.equal((await taskctl("microvm", "resume", id)).stdout.trim(), `${id} RUNNING`);
    const ls = await taskctl("microvm", "ls");
    assert.match(ls.stdout, /^ID\s+STATE\s+IMAGE\s+ENDPOINT\s+STARTED$/m);
    assert.match(ls.stdout, new RegExp(`^${id}\\s+RUNNING\\s+sandbox\\s+`, "m"));
    // Over NATS the caller is the `internal` user, another principal than HTTP's: not its instance.
    const overNats = await runHere(["microvm", "get", id, "--nats", vms.nats.url], {
      ...env,
      NATS_AUTH_DIR: vms.nats.authDir ?? "",
    });
    assert.equal(overNats.stderr.trim(), `error: no microVM with id ${id}`);
    assert.equal((await taskctl("microvm", "terminate", id)).stdout.trim(), `${id} TERMINATED`);
    const missing = await taskctl("microvm", "get", "no-such-vm");
    assert.equal(missing.stderr.trim(), "error: no microVM with id no-such-vm");
    const invalid = await taskctl("microvm", "run", "--idle", "0");
    assert.equal(invalid.code, 1);
    assert.match(invalid.stderr, /invalid request: idlePolicy\.maxIdleDurationSeconds: /);
  });

  it("cli - microvm run --wait is one RunMicrovm that the service answers at RUNNING, the CLI's timeout on top of its wait", async () => {
    await vms.overHttp.createImage({ name: "slow-cli", module: slowImage(2_000) });
    const proxy = await recordingProxy(vms.microvmUrl, defer);
    // 500 ms would abort a request that does not add the wait: the instance takes over 2 s to start.
    const started = Date.now();
    const result = await runHere(["microvm", "run", "--image", "slow-cli", "--wait", "--json"], {
      ...env,
      MICROVM_API_URL: proxy.url,
      TASKCTL_TIMEOUT_MS: "500",
    });
    const waited = Date.now() - started;
    assert.equal(result.code, 0, result.stderr);
    const vm = JSON.parse(result.stdout) as { microvmId: string; state: string; imageIdentifier: string };
    await vms.overHttp.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    assert.deepEqual([vm.state, vm.imageIdentifier], ["RUNNING", "slow-cli"]);
    assert.ok(waited >= 2_000, `answered after ${waited} ms`);
    // No polling: the run that waits, then one read of the record it prints.
    assert.deepEqual(proxy.seen, [
      "POST /2025-09-09/microvms?wait=running&waitSeconds=30",
      `GET /2025-09-09/microvms/${vm.microvmId}`,
    ]);
  });

  it("cli - microvm run --wait-seconds: an instance not RUNNING by then is exit 1 naming it; it goes on starting", async () => {
    await vms.overHttp.createImage({ name: "slower-cli", module: slowImage(4_000) });
    const started = Date.now();
    const result = await taskctl("microvm", "run", "--image", "slower-cli", "--wait-seconds", "1", "--json");
    const waited = Date.now() - started;
    const id = /^error: microVM (\S+): /.exec(result.stderr)?.[1];
    if (id) await waitForState(vms.overHttp, id, ["RUNNING"], 30_000);
    if (id) await vms.overHttp.terminateMicrovm({ microvmIdentifier: id });
    assert.equal(result.code, 1);
    assert.equal(result.stdout, "");
    assert.ok(id, result.stderr);
    assert.match(result.stderr, /the instance is still PENDING after 1 s: it goes on starting/);
    assert.match(result.stderr, new RegExp(`\nhint: \`taskctl microvm get ${id}\` shows its state`));
    assert.ok(waited >= 1_000 && waited < 4_000, `answered after ${waited} ms`);
  });

  it("cli - the installed command (cli-bin.mjs): output, and exit status 0, 1 or 2", async () => {
    const bin = (...args: string[]) => run(process.execPath, ["client/cli-bin.mjs", ...args], env);
    const port = await freePort();
    const [created, missing, usage, unreachable, version, overNats] = await Promise.all([
      bin("tasks", "create", "from a shell", "--json"),
      bin("jobs", "get", "nope"),
      bin("tasks", "delete", "x"),
      bin("tasks", "get", "x", "--url", `http://127.0.0.1:${port}`),
      bin("--version"),
      bin("jobs", "get", "nope", "--nats", svc.nats.url),
    ]);
    assert.equal(created.code, 0, created.stderr);
    const task = JSON.parse(created.stdout) as { id: string };
    assert.deepEqual(task, { id: task.id, title: "from a shell", completed: false });
    assert.equal(missing.code, 1);
    assert.equal(missing.stderr, "error: no job with id nope\n");
    assert.equal(missing.stdout, "");
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /^error: unknown command "tasks delete"/);
    assert.equal(unreachable.code, 1);
    assert.match(unreachable.stderr, /cannot reach the Task API .*\nhint: .*`npm start`/);
    // Read from package.json, which the bundle's chunks find one level up.
    assert.deepEqual([version.code, version.stdout], [0, "typed-task-service 0.1.0\n"]);
    // The NATS client comes from chunks of its own; a CommonJS package's named exports must survive that.
    assert.deepEqual([overNats.code, overNats.stderr], [1, "error: no job with id nope\n"]);
  });

  it("cli - `npx taskctl` and `npm run cli` run the same CLI; npx runs the linked bin without reading the tree", async (t) => {
    // A bin of the root package makes npx load the whole dependency tree and install the root
    // into its cache (`_npx/`); the bin npm links into node_modules/.bin is run straight away.
    const cache = await mkdtemp(join(tmpdir(), "npx-cache-"));
    t.after(() => rm(cache, { recursive: true, force: true }));
    const [npx, npm] = await Promise.all([
      run("npx", ["--no-install", "taskctl", "tasks", "create", "via npx", "--json"], {
        ...env,
        npm_config_cache: cache,
      }),
      run("npm", ["run", "-s", "cli", "--", "jobs", "create", "via npm run", "--json"], env),
    ]);
    assert.deepEqual(
      (await readdir(cache)).filter((entry) => entry !== "_logs"),
      [],
      "npx installed nothing into its cache",
    );
    assert.equal(npx.code, 0, npx.stderr);
    assert.equal(JSON.parse(npx.stdout).title, "via npx");
    assert.equal(npm.code, 0, npm.stderr);
    assert.equal(typeof JSON.parse(npm.stdout), "string");
  });
});

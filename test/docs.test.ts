// Every shell and TypeScript snippet of the README and of docs/ runs, as written, against a
// running service, so the docs cannot drift from what the service does.
//
// The service runs as `npm start` runs it (the esbuild bundle `npm run build` makes, on plain
// node, with its own private nats-server and DATA_DIR `.data`) in a scratch directory holding a
// copy of every file of the checkout that git does not ignore, with node_modules, .tools and
// dist linked (test/helpers/scratch-checkout.ts), and the snippets run in that same directory,
// so `.data/nats-url`, `./client/index.ts` and `npx taskctl` mean what they mean to a user, and
// what a snippet writes (`api-keys`, `alice.key`, `my-image.ts`…) lands in the copy: never in
// the checkout, where a user keeps such files (the names `.gitignore` lists, and their own).
// Three things differ from a user's machine, each stated here: the APIs
// listen on free ports, so `:8787`, `:8788` and `:8789` in a snippet are replaced by those
// ports (and TASK_API_URL / JOB_API_URL / MICROVM_API_URL point taskctl at them); and curl
// runs with `--fail-with-body`, so a snippet whose request answers an HTTP error fails; and
// `npx taskctl` runs the package's bin without npm's start (below).
//
// Markers, on the line before a fence:
//   <!-- not run: <reason> -->   the block is skipped; the reason is printed
//   <!-- file: <name> -->        the block is written to <name> in the scratch directory
//   <!-- http errors expected --> curl runs without --fail-with-body in this block
// Blocks tagged `sh` run in one bash per page (`set -euo pipefail`), in order; blocks tagged
// `ts` run one by one with tsx and must exit 0 by themselves. Other tags (`text`, `json`,
// `yaml`…) are not code to run. A shell command followed by a comment that is JSON
// (`curl -s …/$ID   # {"id":"…","title":"write docs","completed":false}`) must print JSON of
// that shape: the same keys, values of the same types (test/helpers/json-shape.mjs).
//
// After the pages: the files the snippets left must pass `biome ci`, the files planted in the
// checkout under the names snippets write must be as they were, and docs/discovery.md's
// endpoint tables must name what the running service registers.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { lstat, mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Svcm, type ServiceInfo } from "@nats-io/services";
import { connectToService } from "../client/index.ts";
import { lifo } from "./helpers/defer.ts";
import { code, markdownTables, type Table } from "./helpers/doc-tables.ts";
import { codeBlocks, withShapeChecks, writtenFiles, type Block } from "./helpers/doc-snippets.ts";
import { changedFiles, plantFiles, removePlanted, type Planted } from "./helpers/planted-files.ts";
import { scratchCheckout } from "./helpers/scratch-checkout.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const defer = lifo(after);

interface Run {
  code: number | null;
  output: string;
}

function run(
  command: string,
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv,
  input?: string,
  timeoutMs = 180_000,
): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd, env, stdio: ["pipe", "pipe", "pipe"], detached: true });
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    child.stderr.on("data", (d) => (output += d));
    const timer = setTimeout(() => {
      output += `\n[killed after ${timeoutMs} ms]`;
      process.kill(-child.pid!, "SIGKILL");
    }, timeoutMs);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
    child.stdin.end(input ?? "");
  });
}

const pages = [
  "README.md",
  ...(await readdir(join(root, "docs")))
    .filter((f) => f.endsWith(".md"))
    .sort()
    .map((f) => `docs/${f}`),
];
const blocksByPage = new Map<string, Block[]>();
for (const page of pages) blocksByPage.set(page, codeBlocks(page, await readFile(join(root, page), "utf8")));

/** What the docs have a user write in the checkout, and names a user keeps there (`.gitignore`'s, a bundle, a spec). */
const allBlocks = [...blocksByPage.values()].flat();
const docsWrite = [...new Set(allBlocks.flatMap(writtenFiles))];
const userFiles = [...new Set([...docsWrite, "api-keys", "x.key", ".env", "my-image.mjs", "openapi.json"])];

let work: string;
let service: ServiceProcess;
let env: NodeJS.ProcessEnv;
let ports: Record<string, string>;
let planted: Planted[];
/** The scratch directory's files and their mtimes before any snippet ran. */
let filesBefore: Map<string, number>;

before(async () => {
  // Planted before the scratch directory is made, so that a copy or a link of the checkout sees them.
  planted = await plantFiles(root, userFiles);
  defer(() => removePlanted(root, planted));
  // The build writes the repository's own dist/ (scripts/build.mjs), which the work directory
  // then links.
  const build = await run("npm", ["run", "-s", "build"], root, process.env);
  assert.equal(build.code, 0, `npm run build: ${build.output}`);
  work = await scratchCheckout(root);
  defer(() => rm(work, { recursive: true, force: true }));
  await mkdir(join(work, ".curl"));
  await writeFile(join(work, ".curl", ".curlrc"), "fail-with-body\nmax-time = 60\n");
  service = await startServiceProcess({ LOG_FORMAT: "json" }, [], { cwd: work, entry: ["dist/main.mjs"] });
  defer(() => service.stop());
  ports = {
    "8787": new URL(service.taskUrl).port,
    "8788": new URL(service.jobUrl).port,
    "8789": new URL(service.microvmUrl).port,
  };
  env = {
    ...process.env,
    CURL_HOME: join(work, ".curl"),
    TASK_API_URL: service.taskUrl,
    JOB_API_URL: service.jobUrl,
    MICROVM_API_URL: service.microvmUrl,
    NATS_URL: "",
    DATA_DIR: "",
    LOG_LEVEL: "warn",
  };
  filesBefore = await fileTimes(work);
  for (const block of allBlocks) if (block.writeTo) await writeFile(join(work, block.writeTo), block.code);
});

/** The files under `dir` with their mtimes, but those of the service (`.data`) and of curl's settings (`.curl`). */
async function fileTimes(dir: string): Promise<Map<string, number>> {
  const times = new Map<string, number>();
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    const path = join(entry.parentPath, entry.name).slice(dir.length + 1);
    if (!entry.isFile() || /^\.(data|curl)\//.test(path)) continue;
    times.set(path, (await lstat(join(dir, path))).mtimeMs);
  }
  return times;
}

/**
 * Instances of the service's microVM host not ending or ended (TERMINATING, TERMINATED, FAILED), from its
 * `microvm_instances{state}` gauge.
 */
async function liveInstances(): Promise<number> {
  const metrics = await (await fetch(`${service.taskUrl}/metrics`)).text();
  let live = 0;
  for (const [, state, count] of metrics.matchAll(/^microvm_instances\{state="(\w+)"\} (\d+)$/gm))
    if (!["TERMINATING", "TERMINATED", "FAILED"].includes(state!)) live += Number(count);
  return live;
}

// `npx taskctl` runs the bin npm links into node_modules/.bin from client/taskctl/; npm's own
// start costs about half a second of CPU per call here, so the snippets' shell runs the same
// bin directly. That npx finds it is checked once, for real ("npx taskctl runs the package's
// bin" below).
const taskctlBin = join(
  root,
  "client/taskctl",
  (JSON.parse(await readFile(join(root, "client/taskctl/package.json"), "utf8")) as { bin: { taskctl: string } }).bin
    .taskctl,
);
const npxTaskctl =
  `npx() { if [ "\${1:-}" = taskctl ]; then shift; node ${JSON.stringify(taskctlBin)} "$@"; else ` +
  `command npx "$@"; fi; }`;

/** The snippet with the documented default ports replaced by the service's. */
function localized(code: string): string {
  return code.replace(/(?<=[:/])(8787|8788|8789)\b/g, (port) => ports[port]!);
}

/** A block whose requests answer errors on purpose: curl without the --fail-with-body rc. */
function withoutFail(code: string): string {
  return `export CURL_HOME=/nonexistent\n${code}export CURL_HOME=${JSON.stringify(env.CURL_HOME)}\n`;
}

/** A shell block as its page's bash runs it. */
function shellCode(block: Block): string {
  const code = withShapeChecks(localized(block.code), block.file, block.line + 1);
  return `# ${block.file}:${block.line}\n${block.httpErrors ? withoutFail(code) : code}`;
}

/**
 * The endpoints docs/discovery.md's table of service `info.name` names, as INFO lists them. A
 * column headed "`<operation>-suffix` in queue group `…`" (or no queue group) gives each row's
 * operation with a subject there an endpoint; `<owner>` is the instance's `owner`, `<owner token>`
 * and `<host token>` its `owner` and `host_id` in base64url.
 */
function documentedEndpoints(tables: Table[], info: ServiceInfo): string[] {
  const table = tables.find((t) => t.heading === `\`${info.name}\``);
  assert.ok(table, `docs/discovery.md has a table under the heading \`${info.name}\``);
  const token = (value = "") => Buffer.from(value).toString("base64url");
  const fill = (template: string, operation: string) =>
    template
      .replaceAll("<operation>", operation)
      .replaceAll("<owner token>", token(info.metadata?.owner))
      .replaceAll("<host token>", token(info.metadata?.host_id))
      .replaceAll("<owner>", info.metadata?.owner ?? "");
  const endpoints: string[] = [];
  for (const column of table.header.slice(1)) {
    const [name = "", queue = ""] = [...column.matchAll(/`([^`]*)`/g)].map((m) => m[1]!);
    for (const row of table.rows) {
      const operation = code(row[table.header[0]!]!);
      const subject = code(row[column]!);
      if (subject)
        endpoints.push(`${fill(name, operation)} ${fill(subject, operation)} queue=${fill(queue, operation)}`);
    }
  }
  return endpoints.sort();
}

function failure(block: Block, result: Run): string {
  return `${block.file}:${block.line} (${block.lang}) exited ${result.code}:\n${result.output.slice(-4000)}`;
}

describe("docs", () => {
  it("docs - the markers are understood and every page has its snippets parsed", () => {
    const blocks = [...blocksByPage.values()].flat();
    assert.ok(
      blocks.some((b) => b.lang === "sh" && !b.skip),
      "some shell snippets run",
    );
    assert.ok(
      blocks.some((b) => b.lang === "ts" && !b.skip && !b.writeTo),
      "some TypeScript snippets run",
    );
    for (const block of blocks) {
      assert.ok(
        !/^(bash|shell|console|typescript|js|javascript)$/.test(block.lang),
        `${block.file}:${block.line}: tag it sh or ts so it runs, or text`,
      );
      // Under pipefail, a writer that `head` cuts off fails with SIGPIPE or a write error, by timing.
      if (block.lang === "sh" && !block.skip)
        assert.doesNotMatch(block.code, /\|\s*head\b/, `${block.file}:${block.line}: no pipe into head`);
    }
    for (const name of ["api-keys", "alice.key", "my-image.ts", "example-image.ts"])
      assert.ok(docsWrite.includes(name), `the files the docs write (${docsWrite.join(", ")}) include ${name}`);
    assert.ok(
      blocks.some((b) => b.lang === "sh" && withShapeChecks(b.code, b.file, b.line + 1) !== b.code),
      "some shell commands are followed by the JSON they print",
    );
  });

  for (const page of pages) {
    const blocks = blocksByPage.get(page)!;
    const runnable = blocks.filter((b) => (b.lang === "sh" || b.lang === "ts") && !b.writeTo);
    if (runnable.length === 0) continue;
    it(`docs - ${page}: every snippet runs and leaves no microVM instance running`, async (t) => {
      const liveBefore = await liveInstances();
      for (const block of runnable.filter((b) => b.skip))
        t.diagnostic(`not run: ${block.file}:${block.line}: ${block.skip}`);
      if (runnable.every((b) => b.skip)) return t.skip("every snippet of the page is marked not run (reasons above)");
      const shell = runnable.filter((b) => b.lang === "sh" && !b.skip);
      if (shell.length > 0) {
        const script = ["set -euo pipefail", npxTaskctl, ...shell.map(shellCode)].join("\n");
        const result = await run("bash", ["-c", script], work, env);
        assert.equal(result.code, 0, failure(shell[0]!, result));
      }
      let n = 0;
      for (const block of runnable.filter((b) => b.lang === "ts" && !b.skip)) {
        const name = `snippet-${page.replace(/\W/g, "-")}-${n++}.ts`;
        await writeFile(join(work, name), localized(block.code));
        const result = await run(process.execPath, ["--import", "tsx", name], work, env);
        await rm(join(work, name));
        assert.equal(result.code, 0, failure(block, result));
      }
      // A user who runs a page as written is not left paying for an instance it launched.
      const liveAfter = await liveInstances();
      assert.ok(
        liveAfter <= liveBefore,
        `${page} leaves ${liveAfter - liveBefore} microVM instance(s) running: terminate what a snippet launches`,
      );
    });
  }

  it("docs - what the snippets write lands in the scratch directory; the checkout's files are as they were", async () => {
    assert.deepEqual(await changedFiles(root, planted), [], "files in the checkout changed while the snippets ran");
    assert.deepEqual(planted.map((p) => p.name).sort(), [...userFiles].sort(), "every name is planted or found");
    const runBlocks = allBlocks.filter((b) => !b.skip);
    for (const name of new Set(runBlocks.flatMap(writtenFiles))) {
      const written = await lstat(join(work, name)).catch(() => undefined);
      assert.ok(written?.isFile(), `${name}, which a snippet writes, is a file of the scratch directory`);
    }
  });

  it("docs - what the snippets leave in the directory passes lint (biome ci, as npm run lint)", async () => {
    const left = [...(await fileTimes(work))]
      .filter(([path, mtime]) => filesBefore.get(path) !== mtime)
      .map(([p]) => p);
    assert.ok(left.length > 0, "the snippets write files");
    const biome = join(work, "node_modules", ".bin", "biome");
    const lint = await run(biome, ["ci", "--colors=off", "--files-ignore-unknown=true", ...left], work, env);
    assert.equal(lint.code, 0, `biome ci ${left.join(" ")}:\n${lint.output.slice(-4000)}`);
  });

  it("docs - discovery.md's endpoint tables name every endpoint the running service registers", async () => {
    const nc = await connectToService({ env: { DATA_DIR: join(work, ".data") }, name: "docs-test" });
    try {
      const infos: ServiceInfo[] = [];
      for await (const info of await new Svcm(nc).client({ strategy: "stall", maxWait: 1000 }).info()) infos.push(info);
      const tables = markdownTables(await readFile(join(root, "docs/discovery.md"), "utf8"));
      assert.deepEqual(infos.map((i) => i.name).sort(), ["actors", "microvms"]);
      for (const info of infos) {
        const registered = info.endpoints.map((e) => `${e.name} ${e.subject} queue=${e.queue_group}`).sort();
        assert.deepEqual(documentedEndpoints(tables, info), registered, `docs/discovery.md's table of ${info.name}`);
      }
    } finally {
      await nc.close();
    }
  });

  it("docs - npx taskctl runs the package's bin, which the snippets' shell calls directly", async () => {
    const real = await run("npx", ["taskctl", "--version"], work, env);
    const direct = await run("bash", ["-c", `${npxTaskctl}\nnpx taskctl --version`], work, env);
    assert.equal(real.code, 0, real.output);
    assert.equal(direct.code, 0, direct.output);
    assert.match(real.output, /\d+\.\d+\.\d+/);
    assert.equal(direct.output, real.output);
  });

  it("docs - the service is still serving after every snippet", async () => {
    const res = await fetch(`${service.taskUrl}/readyz`);
    assert.equal(res.status, 200);
  });
});

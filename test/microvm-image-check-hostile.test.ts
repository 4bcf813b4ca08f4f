// Hostile pushes against a real service process (its own nats-server, the wall MICROVM_PROVIDER
// picks, gVisor where it runs; test/microvm-image-check-hostile-sandbox.test.ts runs the same on the
// bubblewrap sandbox; real HTTP): modules importing host files (a planted secret, the service's NATS seeds,
// /dev/zero, /proc/self/environ) are 400s naming the import and carrying no byte of the file,
// at a bounded cost in the service's memory; images whose readiness answer never ends, stalls
// or never comes fail their push within the check's limit while a good push goes through;
// SIGTERM stops the service within 10 s while such a check hangs.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { IMAGE_CHECK_TIMEOUT_MS } from "../vm-runtime/registry/check.ts";
import { ISOLATED_START_TIMEOUT_MS } from "../vm-runtime/host/isolated-provider.ts";
import { CGROUP_KILL_TIMEOUT_MS } from "../vm-runtime/host/cgroups.ts";
import { childProcessesWith } from "../vm-runtime/host/proc.ts";
import { SANDBOX_MARKER } from "../vm-runtime/host/sandbox-command.ts";
import { GVISOR_MARKER } from "../vm-runtime/host/gvisor-provider.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";
import { lifo } from "./helpers/defer.ts";
import { alive, startServiceProcess, type ServiceProcess } from "./helpers/process.ts";

const defer = lifo(after);
/** The wall the service runs checks in (`auto`: gVisor where it runs, else the sandbox). */
const wall = process.env.IMAGE_CHECK_PROVIDER ?? "auto";
/** One token (an identifier), so a parser's error about the file would quote it whole. */
const marker = `HOSTILE${randomBytes(12).toString("hex")}`;
const secretDir = mkdtempSync(join(tmpdir(), "hostile-secret-"));
defer(() => rmSync(secretDir, { recursive: true, force: true }));
const secretJson = join(secretDir, "secret.json");
const secretText = join(secretDir, "secret.txt");
writeFileSync(secretJson, JSON.stringify({ marker }));
writeFileSync(secretText, `${marker} is the secret\n`);
/** From any directory of the host, up to `/` and down to the planted secret. */
const relativeSecret = `${"../".repeat(24)}${secretJson.slice(1)}`;

const inlineDefineImage =
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", ` +
  `methods: d.methods, fetch: d.fetch ?? (() => new Response("no", { status: 404 })) });`;
const greeter = (greeting: string) =>
  `${inlineDefineImage}\nexport default defineImage({ methods: { greet: { handler: (name) => ` +
  `${JSON.stringify(greeting)} + ", " + name } } });\n`;
const leaking = (imports: string) =>
  `${inlineDefineImage}\n${imports}\nexport default defineImage({ methods: { leak: ` +
  `{ handler: () => String(secret) } } });\n`;

/**
 * An image that patches the runtime's answers to `GET /__rpc__/` (it runs in the runtime's
 * process): `endless` streams a body forever, `stall` sends the head, then a byte now and then, and never ends,
 * `silent` never answers at all. Each such answer is announced on stdout as
 * `hostile-answer <tag> <n>` (the service logs it).
 */
const hostileAnswer = (mode: "endless" | "stall" | "silent", tag: string) => `
import http from "node:http";
${inlineDefineImage}
const P = http.ServerResponse.prototype;
const { writeHead, end } = P;
const probed = (res) => res.req && res.req.method === "GET" && res.req.url === "/__rpc__/";
let answers = 0;
P.writeHead = function (status, ...rest) {
  if (!probed(this)) return writeHead.call(this, status, ...rest);
  if (${JSON.stringify(mode)} === "silent") return this;
  return writeHead.call(this, 200, { "content-type": "application/json" });
};
P.end = function (...args) {
  if (!probed(this)) return end.apply(this, args);
  answers += 1;
  process.stdout.write("hostile-answer ${tag} " + answers + "\\n");
  if (${JSON.stringify(mode)} === "silent") return this;
  this.write('{"methods":[');
  if (${JSON.stringify(mode)} === "stall") {
    // A space now and then: an idle timeout never fires, only a deadline for the whole answer.
    const drip = setInterval(() => (this.destroyed ? clearInterval(drip) : this.write(" ")), 200);
    return this;
  }
  const chunk = Buffer.alloc(64 * 1024, 0x20);
  const pump = () => {
    while (!this.destroyed && this.write(chunk));
    if (!this.destroyed) this.once("drain", pump);
  };
  pump();
  return this;
};
export default defineImage({ methods: { hello: { handler: () => "hello" } } });
`;

let svc: ServiceProcess;
let dataDir: string;

interface PushAnswer {
  status: number;
  body: { _tag?: string; message?: string; name?: string };
  ms: number;
}

async function push(name: string, module: string): Promise<PushAnswer> {
  const started = performance.now();
  const res = await fetch(`${svc.microvmUrl}/2025-09-09/images`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name, module }),
  });
  const body = (await res.json()) as PushAnswer["body"];
  return { status: res.status, body, ms: performance.now() - started };
}

/** The service process's resident memory in bytes (VmRSS). */
function serviceRss(): number {
  const kib = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${svc.child.pid}/status`, "utf8"))?.[1];
  return Number(kib) * 1024;
}

/** Resolves once the service has logged an instance line `hostile-answer <tag> <n>` with n >= `count`. */
async function answered(tag: string, count: number, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const seen = () =>
    svc.logs.some((entry) => {
      const match = /^hostile-answer (\S+) (\d+)$/.exec(String(entry.line ?? ""));
      return match?.[1] === tag && Number(match[2]) >= count;
    });
  while (!seen()) {
    if (Date.now() > deadline) assert.fail(`the instance never logged hostile-answer ${tag} ${count}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const instancesOfService = () =>
  [SANDBOX_MARKER, GVISOR_MARKER, INSTANCE_MARKER].flatMap((m) => childProcessesWith(svc.child.pid!, m));

before(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "hostile-data-"));
  defer(() => rmSync(dataDir, { recursive: true, force: true }));
  // The marker is in the service's own environment too: /proc/self/environ of the host holds it.
  svc = await startServiceProcess({
    DATA_DIR: dataDir,
    LOG_LEVEL: "debug",
    HOSTILE_MARKER: marker,
    MICROVM_PROVIDER: wall,
  });
  defer(() => svc.stop("SIGKILL"));
  const warm = await push("warm-up", greeter("warm"));
  assert.equal(warm.status, 200, JSON.stringify(warm.body));
});

describe(`image check, hostile modules (MICROVM_PROVIDER=${wall})`, () => {
  it("image check - imports of host files are 400s naming the import, without a byte of the file, at a bounded memory cost", async (t) => {
    const seedDir = join(dataDir, "nats-auth");
    const seedFile = join(seedDir, readdirSync(seedDir).find((file) => /seed|nk|creds/.test(file)) ?? "");
    const seed = readFileSync(seedFile, "utf8").trim();
    assert.ok(seed.length >= 20, `a real seed file to aim at: ${seedFile}`);
    const cases: [label: string, module: string, named: string][] = [
      [
        "absolute path, JSON",
        leaking(`import secret from ${JSON.stringify(secretJson)} with { type: "json" };`),
        secretJson,
      ],
      [
        "relative path, JSON",
        leaking(`import secret from ${JSON.stringify(relativeSecret)} with { type: "json" };`),
        relativeSecret,
      ],
      [
        "a text file as JSON",
        leaking(`import secret from ${JSON.stringify(secretText)} with { type: "json" };`),
        secretText,
      ],
      [
        "the service's NATS seed as JSON",
        leaking(`import secret from ${JSON.stringify(seedFile)} with { type: "json" };`),
        seedFile,
      ],
      [
        "absolute path, text",
        leaking(`import secret from ${JSON.stringify(secretText)} with { type: "text" };`),
        secretText,
      ],
      [
        "the service's NATS seed, text",
        leaking(`import secret from ${JSON.stringify(seedFile)} with { type: "text" };`),
        seedFile,
      ],
      ["/dev/zero, text", leaking(`import secret from "/dev/zero" with { type: "text" };`), "/dev/zero"],
      [
        "/proc/self/environ, JSON",
        leaking(`import secret from "/proc/self/environ" with { type: "json" };`),
        "/proc/self/environ",
      ],
      [
        "re-export from a host file",
        `${leaking("const secret = 1;")}export { marker } from ${JSON.stringify(secretJson)} with { type: "json" };\n`,
        secretJson,
      ],
      [
        "literal dynamic import",
        leaking(`const secret = await import(${JSON.stringify(secretText)}, { with: { type: "text" } });`),
        secretText,
      ],
      [
        "escaped specifier",
        leaking(`import secret from "\\u002fproc\\u002fself\\u002fenviron" with { type: "json" };`),
        "/proc/self/environ",
      ],
    ];
    const before = serviceRss();
    for (const [label, module, named] of cases) {
      const { status, body } = await push("hostile", module);
      const answer = JSON.stringify(body);
      assert.ok(!answer.includes(marker), `${label} carries the secret: ${answer}`);
      assert.ok(!answer.includes(seed.slice(0, 12)), `${label} carries the seed: ${answer}`);
      assert.equal(status, 400, `${label}: ${answer}`);
      assert.equal(body._tag, "InvalidImage", label);
      assert.match(
        body.message!,
        /ImageError: the module imports ".*" \(line \d+\): an image module can import only node builtins/,
        label,
      );
      assert.ok(body.message!.includes(JSON.stringify(named)), `${label} names the import: ${body.message}`);
    }
    // The runtime's `require` loads builtins only (not an import: the lexer lets it through).
    const required = await push("hostile", leaking(`const secret = require(${JSON.stringify(secretJson)});`));
    assert.equal(required.status, 400, JSON.stringify(required.body));
    assert.match(required.body.message!, /ImageError: require\(".*secret\.json"\): an image module can require only/);
    assert.ok(!required.body.message!.includes(marker), `require carries the secret: ${required.body.message}`);
    const grown = serviceRss() - before;
    t.diagnostic(`service RSS grew by ${(grown / 1024 / 1024).toFixed(1)} MiB over ${cases.length + 1} pushes`);
    assert.ok(grown <= 50 * 1024 * 1024, `the service grew by ${grown} bytes`);
    assert.equal((await push("after-hostile", greeter("still"))).status, 200, "the service still takes pushes");
  });

  for (const mode of ["endless", "stall", "silent"] as const) {
    it(`image check - a readiness answer that is ${mode} fails its push within the check's limit; a concurrent good push goes through`, async (t) => {
      const hostile = push(`answer-${mode}`, hostileAnswer(mode, `answer-${mode}`));
      await answered(`answer-${mode}`, 1);
      const good = await push(`good-beside-${mode}`, greeter(mode));
      assert.equal(good.status, 200, JSON.stringify(good.body));
      const { status, body, ms } = await hostile;
      t.diagnostic(`${mode}: ${status} after ${Math.round(ms)} ms: ${body.message}`);
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(body._tag, "InvalidImage");
      const expected =
        mode === "endless"
          ? /does not answer as an image: its methods answer is over 1048576 bytes/
          : mode === "stall"
            ? /does not answer as an image: its methods answer did not end within 8 s/
            : /does not load as an image: it did not answer its readiness probe within 8 s/;
      assert.match(body.message!, expected);
      // The host's bound on booting the wall, then the module's time to load and to answer.
      const bound = ISOLATED_START_TIMEOUT_MS + 2 * IMAGE_CHECK_TIMEOUT_MS;
      assert.ok(ms < bound, `the push took ${ms} ms, over the ${bound} ms the check allows`);
      assert.ok(alive(svc.child.pid!), "the service lives");
    });
  }

  it("image check - SIGTERM stops the service once a hanging check's time is up, leaving no instance", async (t) => {
    const hostile = push("answer-at-exit", hostileAnswer("stall", "answer-at-exit")).catch((err: Error) => err.message);
    // The health probe took the first answer's head; the methods request is the second one.
    await answered("answer-at-exit", 2);
    assert.ok(instancesOfService().length > 0, "the check's instance runs");
    const started = performance.now();
    // The check in flight is let finish: its methods answer has IMAGE_CHECK_TIMEOUT_MS, which
    // began before the signal. Then the host stops its walls, each within its cgroup's kill
    // bound (walls are stopped together).
    const bound = IMAGE_CHECK_TIMEOUT_MS + CGROUP_KILL_TIMEOUT_MS;
    // Bounded, so a service that never stops fails the test instead of hanging it.
    const code = await Promise.race([
      svc.stop("SIGTERM"),
      new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), bound + 5_000).unref()),
    ]);
    const ms = performance.now() - started;
    assert.notEqual(code, "still running", `the service did not stop within ${bound + 5_000} ms of SIGTERM`);
    t.diagnostic(`exit code ${code} after ${Math.round(ms)} ms; the push got ${JSON.stringify(await hostile)}`);
    assert.ok(ms < bound, `the service took ${ms} ms to stop, over ${bound} ms`);
    assert.equal(code, 0);
    assert.deepEqual(instancesOfService(), [], "no instance process is left");
  });
});

// A key removed from the key file reaches what it opened, across real processes: a gateway and
// a microVM host apart on one NATS. Principal A holds keys K and K2, B holds one. After K's line
// is removed and the gateway gets SIGHUP, what K opened (a log follow, a long poll) ends within
// 5 s of the signal, with a structured 401; K2's and B's follows go on; the instance's proxy
// refuses a token asked for with K (403 `revoked`) and still takes one asked for with K2. And a
// host that starts after the removal knows it: an instance SUSPENDED into a snapshot (gVisor)
// outlives its host process, and the host started again adopts it and refuses the token from
// its first request, while the other key's resumes it.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { newApiKey } from "../gateway/index.ts";
import { checkGvisor } from "../vm-runtime/service/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, policy } from "./helpers/microvm.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";

const defer = lifo(after);
const gvisor = await checkGvisor();
const k = newApiKey("alice");
const k2 = newApiKey("alice");
const bobKey = newApiKey("bob");
/** The contract's bound, from the signal to the end of what the removed key opened. */
const REVOCATION_BOUND_MS = 5_000;

/** An image that writes a line when asked. */
const TALKER = `
const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, fetch: () => new Response("talker", { status: 200 }) });
export default defineImage({ methods: { say: { handler: (line) => { console.log(line); return line; } } } });
`;
type Talker = { say(line: string): Promise<string> };

/** A JSON call to the microVM API with `key`; resolves with status and body. */
async function call(svc: ServiceProcess, key: string, method: string, path: string, body?: unknown) {
  const res = await fetch(`${svc.microvmUrl}/2025-09-09${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** An open `?follow=1` answer: the lines it brought, and when (and how) it ended. */
interface Follow {
  readonly lines: Record<string, unknown>[];
  /** Resolves once a line is `line`. */
  until(line: string): Promise<void>;
  /** Resolves when the answer ends, with `performance.now()` then. */
  readonly ended: Promise<number>;
  close(): void;
}

async function follow(svc: ServiceProcess, key: string, microvmId: string): Promise<Follow> {
  const aborter = new AbortController();
  const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms/${microvmId}/logs?follow=1&limit=1`, {
    headers: { authorization: `Bearer ${key}` },
    signal: aborter.signal,
  });
  assert.equal(res.status, 200);
  const lines: Record<string, unknown>[] = [];
  const waiters: (() => void)[] = [];
  const ended = (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    try {
      for await (const chunk of res.body!) {
        buffered += decoder.decode(chunk, { stream: true });
        const parts = buffered.split("\n");
        buffered = parts.pop()!;
        for (const part of parts) lines.push(JSON.parse(part) as Record<string, unknown>);
        for (const wake of waiters.splice(0)) wake();
      }
    } catch {
      // Closed by the test.
    }
    return performance.now();
  })();
  const until = async (line: string) => {
    while (!lines.some((l) => l.line === line)) {
      const more = new Promise<void>((resolve) => waiters.push(resolve));
      const done = await Promise.race([more.then(() => false), ended.then(() => true)]);
      assert.ok(!done || lines.some((l) => l.line === line), `the follow ended before "${line}"`);
    }
  };
  return { lines, until, ended, close: () => aborter.abort() };
}

describe("api keys revocation - gateway and microVM host apart", () => {
  let gateway: ServiceProcess;
  let alice: { microvmId: string; endpoint: string };
  let bob: { microvmId: string; endpoint: string };
  let keysFile: string;
  const follows: Record<"k" | "k2" | "bob", Follow> = {} as never;
  let longPoll: Promise<{ status: number; body: Record<string, unknown>; at: number }>;
  const tokens: Record<"k" | "k2", string> = {} as never;
  let signalledAt = 0;

  before(async () => {
    const nats = await testNats(defer);
    const dir = await mkdtemp(join(tmpdir(), "api-keys-revocation-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    keysFile = join(dir, "api-keys");
    await writeFile(keysFile, `${k.line}\n${k2.line}\n${bobKey.line}\n`);
    const host = await startServiceProcess(
      { ...nats.env(), LOG_FORMAT: "json", MICROVM_PROVIDER: "process", MICROVM_WARM_INSTANCES: "0" },
      ["--role", "microvms"],
    );
    defer(() => host.stop());
    gateway = await startServiceProcess({ ...nats.env(), LOG_FORMAT: "json", API_KEYS_FILE: keysFile }, [
      "--role",
      "gateway",
    ]);
    defer(() => gateway.stop());

    const runTalker = async (key: string) => {
      assert.equal((await call(gateway, key, "POST", "/images", { name: "talker", module: TALKER })).status, 200);
      const run = await call(gateway, key, "POST", "/microvms?wait=running", {
        imageIdentifier: "talker",
        idlePolicy: policy(),
      });
      assert.equal(run.status, 200, JSON.stringify(run.body));
      const { microvmId, endpoint } = run.body as { microvmId: string; endpoint: string };
      defer(() => call(gateway, bobKey.key, "DELETE", `/microvms/${microvmId}`).catch(() => undefined));
      defer(() => call(gateway, k2.key, "DELETE", `/microvms/${microvmId}`).catch(() => undefined));
      return { microvmId, endpoint };
    };
    alice = await runTalker(k.key);
    bob = await runTalker(bobKey.key);
    const token = async (key: string) => {
      const answer = await call(gateway, key, "POST", `/microvms/${alice.microvmId}/auth-token`, {
        expirationInMinutes: 5,
        allowedPorts: [{ port: 8080 }],
      });
      assert.equal(answer.status, 200);
      return (answer.body.authToken as Record<string, string>)["X-aws-proxy-auth"]!;
    };
    tokens.k = await token(k.key);
    tokens.k2 = await token(k2.key);
    assert.equal(await proxyStatus(alice.endpoint, tokens.k), 200, "K's token opens before the revocation");

    // Each follow has brought a line written after it began: it is open and reading.
    follows.k = await follow(gateway, k.key, alice.microvmId);
    follows.k2 = await follow(gateway, k2.key, alice.microvmId);
    follows.bob = await follow(gateway, bobKey.key, bob.microvmId);
    const aliceTalker = connectMicrovm<Talker>({
      endpoint: alice.endpoint,
      authToken: { "X-aws-proxy-auth": tokens.k2 },
    });
    await aliceTalker.say("before");
    await Promise.all([follows.k.until("before"), follows.k2.until("before")]);
    const logs = await call(gateway, k.key, "GET", `/microvms/${alice.microvmId}/logs?limit=1`);
    const url =
      `${gateway.microvmUrl}/2025-09-09/microvms/${alice.microvmId}/logs` + `?since=${logs.body.cursor}&waitSeconds=30`;
    longPoll = fetch(url, { headers: { authorization: `Bearer ${k.key}` } }).then(async (res) => ({
      status: res.status,
      body: (await res.json()) as Record<string, unknown>,
      at: performance.now(),
    }));
    defer(() => {
      for (const open of Object.values(follows)) open.close();
    });

    await writeFile(keysFile, `${k2.line}\n${bobKey.line}\n`);
    signalledAt = performance.now();
    gateway.child.kill("SIGHUP");
  });
  after(assertNoInstanceLeft);

  it("api keys revocation - the removed key's log follow ends within 5 s of the SIGHUP, with a 401 error line", async () => {
    const endedAt = await byBound(follows.k.ended, signalledAt, "the follow of the removed key ended");
    const ms = endedAt - signalledAt;
    console.log(`# follow of the removed key ended ${ms.toFixed(0)} ms after the SIGHUP`);
    assert.ok(ms < REVOCATION_BOUND_MS, `ended after ${ms} ms`);
    const last = follows.k.lines.at(-1)!;
    assert.equal((last.error as Record<string, unknown>)?._tag, "Unauthorized");
    assert.match(String((last.error as Record<string, unknown>).message), /removed from the key file/);
  });

  it("api keys revocation - the removed key's long poll is answered 401 within 5 s of the SIGHUP", async () => {
    const answer = await byBound(longPoll, signalledAt, "the long poll of the removed key was answered");
    const ms = answer.at - signalledAt;
    console.log(`# long poll of the removed key answered ${ms.toFixed(0)} ms after the SIGHUP`);
    assert.ok(ms < REVOCATION_BOUND_MS, `answered after ${ms} ms`);
    assert.equal(answer.status, 401);
    assert.equal(answer.body._tag, "Unauthorized");
  });

  it("api keys revocation - the proxy refuses a token asked for with the removed key within 5 s, not one of the other key", async () => {
    const deadline = signalledAt + REVOCATION_BOUND_MS;
    let refused: { status: number; body: Record<string, unknown> } | undefined;
    while (!refused) {
      // A request under way when the revocation lands is cut: the next one is refused.
      const res = await fetch(`http://${alice.endpoint}/`, { headers: { "X-aws-proxy-auth": tokens.k } }).catch(
        () => undefined,
      );
      const body = (await res?.text().catch(() => undefined)) ?? "";
      if (res?.status === 403) refused = { status: res.status, body: JSON.parse(body) as Record<string, unknown> };
      else assert.ok(performance.now() < deadline, "the token of the removed key still opens after 5 s");
    }
    console.log(
      `# proxy refused the removed key's token ${(performance.now() - signalledAt).toFixed(0)} ms after the SIGHUP`,
    );
    assert.equal(refused.body._tag, "MicrovmProxyForbidden");
    assert.equal(refused.body.reason, "revoked");
    assert.ok(!JSON.stringify(refused.body).includes(tokens.k), "the token is not echoed");
    assert.equal(await proxyStatus(alice.endpoint, tokens.k2), 200, "the other key's token still opens");
  });

  it("api keys revocation - the other key's and the other principal's follows go on", async () => {
    await byBound(follows.k.ended, signalledAt, "the follow of the removed key ended");
    const aliceTalker = connectMicrovm<Talker>({
      endpoint: alice.endpoint,
      authToken: { "X-aws-proxy-auth": tokens.k2 },
    });
    const bobToken = await call(gateway, bobKey.key, "POST", `/microvms/${bob.microvmId}/auth-token`, {
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    const bobTalker = connectMicrovm<Talker>({
      endpoint: bob.endpoint,
      authToken: bobToken.body.authToken as { "X-aws-proxy-auth": string },
    });
    await Promise.all([aliceTalker.say("after"), bobTalker.say("after")]);
    await Promise.all([follows.k2.until("after"), follows.bob.until("after")]);
    assert.ok(!follows.k.lines.some((l) => l.line === "after"), "the ended follow brought nothing more");
    assert.equal((await call(gateway, k.key, "GET", "/microvms")).status, 401, "the removed key opens nothing");
  });
});

/** `promise`, or a failure naming `what` once the bound after the signal has passed. */
function byBound<T>(promise: Promise<T>, signalledAt: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what}: not within ${REVOCATION_BOUND_MS} ms of the SIGHUP`)),
      signalledAt + REVOCATION_BOUND_MS - performance.now(),
    );
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** Resolves with the first log entry from index `from` on that `matches` (the logs grow as lines come). */
async function logged(svc: ServiceProcess, from: number, matches: (entry: Record<string, unknown>) => boolean) {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const found = svc.logs.slice(from).find(matches);
    if (found) return found;
    assert.ok(Date.now() < deadline, "no such log entry within 15 s");
    await new Promise((resolve) => svc.child.stdout!.once("data", resolve));
  }
}

async function proxyStatus(endpoint: string, token: string): Promise<number> {
  const res = await fetch(`http://${endpoint}/`, { headers: { "X-aws-proxy-auth": token } });
  await res.arrayBuffer();
  return res.status;
}

describe("api keys revocation - a host started after it", { skip: gvisor.ok ? false : gvisor.reason }, () => {
  let nats: TestNats;
  let dataDir: string;
  let gateway: ServiceProcess;
  let keysFile: string;

  before(async () => {
    nats = await testNats(defer);
    dataDir = await mkdtemp(join(tmpdir(), "api-keys-revocation-hosts-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    keysFile = join(dataDir, "api-keys");
    await writeFile(keysFile, `${k.line}\n${k2.line}\n`);
    gateway = await startServiceProcess({ ...nats.env(), LOG_FORMAT: "json", API_KEYS_FILE: keysFile }, [
      "--role",
      "gateway",
    ]);
    defer(() => gateway.stop());
  });
  after(assertNoInstanceLeft);

  const hostProcess = async () => {
    const env = {
      ...nats.env(),
      LOG_FORMAT: "json",
      DATA_DIR: dataDir,
      MICROVM_HOST_ID: "host-r",
      MICROVM_PROVIDER: "gvisor",
      MICROVM_SNAPSHOTS: "1",
      MICROVM_WARM_INSTANCES: "0",
      MICROVM_MEMORY_MIB: "96",
    };
    const proc = await startServiceProcess(env, ["--role", "microvms"]);
    defer(() => proc.stop("SIGKILL"));
    return proc;
  };

  const stateOf = async (microvmId: string) =>
    (await call(gateway, k2.key, "GET", `/microvms/${microvmId}`)).body as { state: string; endpoint: string };

  async function until(microvmId: string, done: (vm: { state: string; endpoint: string }) => boolean) {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const vm = await stateOf(microvmId);
      if (done(vm)) return vm;
      assert.ok(Date.now() < deadline, `${microvmId} stayed ${vm.state}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  it("api keys revocation - a host started after the SIGHUP refuses the removed key's token at its first request", async () => {
    const first = await hostProcess();
    const run = await call(gateway, k.key, "POST", "/microvms?wait=running", {
      imageIdentifier: "sandbox",
      idlePolicy: policy({ autoResumeEnabled: true }),
    });
    assert.equal(run.status, 200, JSON.stringify(run.body));
    const { microvmId, endpoint } = run.body as { microvmId: string; endpoint: string };
    defer(() => call(gateway, k2.key, "DELETE", `/microvms/${microvmId}`).catch(() => undefined));
    const token = async (key: string) => {
      const answer = await call(gateway, key, "POST", `/microvms/${microvmId}/auth-token`, {
        expirationInMinutes: 5,
        allowedPorts: [{ port: 8080 }],
      });
      return (answer.body.authToken as Record<string, string>)["X-aws-proxy-auth"]!;
    };
    const [removed, kept] = [await token(k.key), await token(k2.key)];
    assert.equal((await call(gateway, k.key, "POST", `/microvms/${microvmId}/suspend`)).status, 200);
    await until(microvmId, (vm) => vm.state === "SUSPENDED");
    await first.stop("SIGKILL");

    await writeFile(keysFile, `${k2.line}\n`);
    const from = gateway.logs.length;
    gateway.child.kill("SIGHUP");
    await logged(gateway, from, (entry) => /API key revocations recorded/.test(String(entry.msg)));

    await hostProcess();
    const adopted = await until(microvmId, (vm) => vm.endpoint !== endpoint);
    assert.equal(adopted.state, "SUSPENDED");
    const refused = await fetch(`http://${adopted.endpoint}/`, { headers: { "X-aws-proxy-auth": removed } });
    const body = (await refused.json()) as Record<string, unknown>;
    assert.equal(refused.status, 403);
    assert.equal(body.reason, "revoked");
    assert.equal((await stateOf(microvmId)).state, "SUSPENDED", "a refused request resumes nothing");
    const opened = await fetch(`http://${adopted.endpoint}/`, { headers: { "X-aws-proxy-auth": kept } });
    assert.equal(opened.status, 200, await opened.text());
    assert.equal((await call(gateway, k2.key, "DELETE", `/microvms/${microvmId}`)).status, 200);
  });
});

// Instance logs over real HTTP (the gateway) and NATS, from real instances: the owner reads
// what its instance wrote, in order, its crash included; follows new lines as they come; another
// principal reads nothing (404); a flood is cut at the per-instance limit without touching
// another instance's lines; the lines outlive the host that stored them.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { ClientError } from "../client/index.ts";
import { runCli } from "../client/cli.ts";
import { metricsText } from "../platform/index.ts";
import { getMicrovmLogs } from "../schemas/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  policy,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";

const defer = lifo(after);
let svc: MicrovmService;
/** Lines kept per instance in this test's stream: a flood past it keeps only the latest. */
const LINES_PER_INSTANCE = 300;

before(async () => {
  svc = await startMicrovmService(defer, {
    quotaPerPrincipal: 20,
    logLimits: { linesPerInstance: LINES_PER_INSTANCE },
    // Every instance imports the image itself: its import-time line is its own (a launch
    // snapshot's import runs once, in the template; microvms.md says so).
    limits: { launchSnapshots: false },
  });
  await svc.overHttp.createImage({ name: "talker", module: TALKER });
});
after(assertNoInstanceLeft);

/**
 * A self-contained image that writes when asked: `say` lines to stdout, `warn` one to stderr, a
 * flood, a crash. stdout and stderr are two pipes: only lines of one are in a certain order, so a
 * test reads one's lines before it writes to the other.
 */
const TALKER = `
const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, fetch: () => new Response("no", { status: 404 }) });
console.log("talker loaded");
export default defineImage({ methods: {
  say: { handler: (tag, n) => { for (let i = 1; i <= n; i++) console.log(tag + " " + i); return n; } },
  warn: { handler: (tag) => { console.error(tag + " warned"); return tag; } },
  raw: { handler: (text) => { console.log(text); return text.length; } },
  flood: { handler: (mib) => { const line = "x".repeat(1023); for (let i = 0; i < mib * 1024; i++) console.log(line); return mib; } },
  crash: { handler: () => { setTimeout(() => { throw new Error("talker gave up"); }, 10); return "bye"; } },
} });
`;

type Talker = {
  say(tag: string, n: number): Promise<number>;
  warn(tag: string): Promise<string>;
  raw(text: string): Promise<number>;
  flood(mib: number): Promise<number>;
  crash(): Promise<string>;
};

async function runTalker(): Promise<{ microvmId: string; talker: Talker }> {
  const run = await svc.overHttp.runMicrovm({ imageIdentifier: "talker", idlePolicy: policy(), wait: "running" });
  const { authToken } = await svc.overHttp.createAuthToken({
    microvmIdentifier: run.microvmId,
    expirationInMinutes: 5,
    allowedPorts: [{ port: 8080 }],
  });
  return { microvmId: run.microvmId, talker: connectMicrovm<Talker>({ endpoint: run.endpoint, authToken }) };
}

/** Reads of instance logs the hosts hold now, waiting for a line (`microvm_log_waits`). */
const logWaits = async () => Number(/^microvm_log_waits (\d+)$/m.exec((await metricsText()).body)?.[1]);
/** The wait of each read a follow makes after its first. */
const FOLLOW_WAIT_SECONDS = getMicrovmLogs.follow.waitSeconds;

/** Resolves once `check` holds; fails with `what` after `timeoutMs`. */
async function eventually(check: () => Promise<boolean>, timeoutMs: number, what: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, what());
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const linesOf = async (microvmId: string, limit = 1000) =>
  (await svc.overHttp.getMicrovmLogs({ microvmIdentifier: microvmId, limit })).items;

/** Reads until `done` holds for the lines read, waiting on the service's long poll (no sleeps). */
async function readUntil(microvmId: string, done: (lines: string[]) => boolean): Promise<string[]> {
  const first = await svc.overHttp.getMicrovmLogs({ microvmIdentifier: microvmId, limit: 1000 });
  const seen = first.items.map((l) => l.line);
  let cursor = first.cursor;
  const deadline = Date.now() + 60_000;
  while (!done(seen)) {
    assert.ok(Date.now() < deadline, `the lines never came; read so far: ${JSON.stringify(seen.slice(-10))}`);
    const page = await svc.overHttp.getMicrovmLogs({ microvmIdentifier: microvmId, since: cursor, waitSeconds: 10 });
    seen.push(...page.items.map((l) => l.line));
    cursor = page.cursor;
  }
  return seen;
}

describe("microvm logs", () => {
  it("microvm logs - the owner reads its instance's lines in order, with their stream and its crash", async () => {
    const { microvmId, talker } = await runTalker();
    assert.equal(await talker.say("a", 3), 3);
    await readUntil(microvmId, (lines) => lines.includes("a 3"));
    await talker.warn("a");
    const said = await readUntil(microvmId, (lines) => lines.includes("a warned"));
    assert.deepEqual(
      said.filter((l) => l.startsWith("a ") || l === "talker loaded"),
      ["talker loaded", "a 1", "a 2", "a 3", "a warned"],
    );
    const detailed = await linesOf(microvmId);
    assert.equal(detailed.find((l) => l.line === "a warned")?.stream, "stderr");
    assert.equal(detailed.find((l) => l.line === "a 1")?.stream, "stdout");
    for (const l of detailed) assert.ok(Number.isFinite(Date.parse(l.time)), `a time: ${l.time}`);
    // No line of the runtime's own start-up protocol is the instance's.
    assert.ok(!detailed.some((l) => l.line.includes("~microvm/runtime")), JSON.stringify(detailed.slice(0, 3)));
    // `limit` answers the latest lines.
    assert.deepEqual(
      (await linesOf(microvmId, 2)).map((l) => l.line),
      ["a 3", "a warned"],
    );
    await talker.crash();
    await waitForState(svc.overHttp, microvmId, ["FAILED", "TERMINATED"], 30_000);
    const after = await readUntil(microvmId, (lines) => lines.some((l) => l.includes("talker gave up")));
    assert.ok(after.indexOf("a warned") < after.findIndex((l) => l.includes("talker gave up")), "the crash comes last");
  });

  it("microvm logs - waitSeconds past 30 or limit past 1000 is a 400 naming the bound, over HTTP as over NATS", async () => {
    for (const [query, field, bound] of [
      ["waitSeconds=31", "waitSeconds", 30],
      ["waitSeconds=120", "waitSeconds", 30],
      ["limit=1001", "limit", 1000],
      ["limit=100000", "limit", 1000],
    ] as const) {
      const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms/any-instance/logs?since=0&${query}`);
      const body = (await res.json()) as { _tag: string; issues: { path: string[]; message: string }[] };
      assert.equal(res.status, 400, query);
      assert.equal(body._tag, "HttpApiDecodeError");
      assert.deepEqual(
        body.issues.map((i) => [i.path, i.message]),
        [[[field], `Expected an integer from 1 to ${bound}, actual "${query.split("=")[1]}"`]],
      );
    }
    const overNats = await svc.overNats
      .getMicrovmLogs({ microvmIdentifier: "any-instance", since: "0", waitSeconds: 31 })
      .then(
        () => undefined,
        (err: unknown) => err,
      );
    assert.ok(overNats instanceof ClientError && overNats.status === 400, String(overNats));
  });

  it("microvm logs - another principal gets 404, over NATS and HTTP alike, and so does an unknown id", async () => {
    const { microvmId, talker } = await runTalker();
    try {
      await talker.say("mine", 1);
      await readUntil(microvmId, (lines) => lines.includes("mine 1"));
      // overNats is the `internal` user: a principal other than HTTP's anonymous caller.
      const other = await svc.overNats.getMicrovmLogs({ microvmIdentifier: microvmId }).then(
        () => undefined,
        (err: unknown) => err,
      );
      assert.ok(other instanceof ClientError, `another principal read them: ${String(other)}`);
      assert.equal(other.status, 404);
      assert.equal((other.error as { _tag: string })._tag, "MicrovmNotFound");
      const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms/no-such-instance/logs`);
      assert.equal(res.status, 404);
      assert.equal(((await res.json()) as { _tag: string })._tag, "MicrovmNotFound");
    } finally {
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: microvmId });
    }
  });

  it("microvm logs - ?follow=1 streams NDJSON: the latest lines, then each new one as it is written", async () => {
    const { microvmId, talker } = await runTalker();
    const aborter = new AbortController();
    try {
      await talker.say("before", 3);
      await readUntil(microvmId, (lines) => lines.includes("before 3"));
      const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms/${microvmId}/logs?follow=1&limit=3`, {
        signal: aborter.signal,
      });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("content-type"), "application/x-ndjson");
      const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      const got: { line: string; stream: string }[] = [];
      let buffered = "";
      const until = async (line: string) => {
        while (!got.some((g) => g.line === line)) {
          const { value, done } = await reader.read();
          assert.ok(!done, `the stream ended before "${line}"`);
          buffered += value;
          const parts = buffered.split("\n");
          buffered = parts.pop()!;
          for (const part of parts) got.push(JSON.parse(part));
        }
      };
      await until("before 3");
      assert.deepEqual(
        got.map((g) => g.line),
        ["before 1", "before 2", "before 3"],
      );
      // Written after the follow began: they arrive on the same answer.
      await talker.say("after", 2);
      await until("after 2");
      assert.deepEqual(
        got.slice(3).map((g) => g.line),
        ["after 1", "after 2"],
      );
      assert.equal(got[3]?.stream, "stdout");
    } finally {
      aborter.abort();
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: microvmId });
    }
  });

  it("microvm logs - a long poll ends when its HTTP client leaves: the host's wait and the gateway's request are released", async () => {
    const { microvmId, talker } = await runTalker();
    try {
      await talker.say("polled", 1);
      await readUntil(microvmId, (lines) => lines.includes("polled 1"));
      const { cursor } = await svc.overHttp.getMicrovmLogs({ microvmIdentifier: microvmId, limit: 1 });
      const url = `${svc.microvmUrl}/2025-09-09/microvms/${microvmId}/logs`;
      // Each held read would end by itself after its waitSeconds: a release before then is the client's leaving.
      for (const [how, query, waitSeconds] of [
        ["a long poll", `since=${cursor}&waitSeconds=30`, 30],
        ["a follow", "follow=1&limit=1", FOLLOW_WAIT_SECONDS],
      ] as const) {
        const [requests, waits] = [svc.gatewayHandle.requester.waiting, await logWaits()];
        const aborter = new AbortController();
        const response = fetch(`${url}?${query}`, { signal: aborter.signal }).then(async (res) => {
          // A follow answers its first lines at once, then holds its next read.
          await res.body?.getReader().read();
        });
        await eventually(
          async () => (await logWaits()) === waits + 1,
          waitSeconds * 1000,
          () => `${how}: the host never held a wait`,
        );
        const held = Date.now();
        assert.ok(svc.gatewayHandle.requester.waiting > requests, `${how}: the gateway holds its request`);
        aborter.abort();
        await response.catch(() => undefined);
        await eventually(
          async () => (await logWaits()) === waits && svc.gatewayHandle.requester.waiting === requests,
          waitSeconds * 1000 - (Date.now() - held),
          () => `${how}: still held ${Date.now() - held} ms after its client left`,
        );
      }
    } finally {
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: microvmId });
    }
  });

  it("microvm logs - taskctl microvm logs prints the lines; -f goes on with each new one", async () => {
    const { microvmId, talker } = await runTalker();
    const env = { MICROVM_API_URL: svc.microvmUrl };
    try {
      await talker.say("cli", 2);
      await readUntil(microvmId, (lines) => lines.includes("cli 2"));
      let printed = "";
      const code = await runCli(["microvm", "logs", microvmId, "--limit", "2"], {
        out: (text) => void (printed += `${text}\n`),
        err: (text) => assert.fail(text),
        env,
      });
      assert.equal(code, 0);
      assert.equal(printed, "cli 1\ncli 2\n");
      // A line that would retitle the terminal is shown, not obeyed; the API keeps it as written.
      const hostile = "\u001b]0;pwned\u0007 title";
      await talker.raw(hostile);
      await readUntil(microvmId, (lines) => lines.includes(hostile));
      let shown = "";
      await runCli(["microvm", "logs", microvmId, "--limit", "1"], {
        out: (text) => void (shown += text),
        err: (text) => assert.fail(text),
        env,
      });
      assert.equal(shown, "^[]0;pwned\\x07 title");
      // -f: the latest line, then the ones written later, each printed as it comes.
      const followed: string[] = [];
      const waiters = new Map<string, () => void>();
      const printedLine = (line: string) => new Promise<void>((resolve) => waiters.set(line, resolve));
      const firstLine = printedLine("^[]0;pwned\\x07 title");
      const lateLines = printedLine("late 2");
      const following = runCli(["microvm", "logs", microvmId, "-f", "--limit", "1"], {
        out: (text) => {
          followed.push(text);
          waiters.get(text)?.();
        },
        err: () => undefined,
        env,
      });
      const ended = following.then((c) => assert.fail(`-f ended (${c}) before the lines it waited for`));
      await Promise.race([firstLine, ended]);
      // Written once the follow printed what was there: they can only come from its long poll.
      await talker.say("late", 2);
      await Promise.race([lateLines, ended]);
      assert.deepEqual(followed, ["^[]0;pwned\\x07 title", "late 1", "late 2"]);
    } finally {
      // Ends the follow too: its next read finds the instance TERMINATED and goes on waiting, until
      // the service stops at the end of the file.
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: microvmId });
    }
  });

  it("microvm logs - a 10 MiB flood keeps the latest lines up to the per-instance limit; another instance's lines stay", async () => {
    const quiet = await runTalker();
    const loud = await runTalker();
    try {
      await quiet.talker.say("quiet", 5);
      await readUntil(quiet.microvmId, (lines) => lines.includes("quiet 5"));
      assert.equal(await loud.talker.flood(10), 10);
      await loud.talker.say("end", 1);
      // The latest lines once the flood is stored (read from the start, not followed).
      await readUntil(loud.microvmId, (lines) => lines.includes("end 1"));
      const flooded = (await linesOf(loud.microvmId)).map((l) => l.line);
      assert.ok(
        flooded.length <= LINES_PER_INSTANCE,
        `kept ${flooded.length} lines, more than the limit of ${LINES_PER_INSTANCE}`,
      );
      assert.equal(flooded.at(-1), "end 1");
      assert.ok(
        flooded.slice(0, -1).every((l) => l === "x".repeat(1023)),
        "the rest are the flood's latest lines",
      );
      assert.deepEqual(
        (await linesOf(quiet.microvmId)).map((l) => l.line),
        ["talker loaded", "quiet 1", "quiet 2", "quiet 3", "quiet 4", "quiet 5"],
      );
    } finally {
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: quiet.microvmId });
      await svc.overHttp.terminateMicrovm({ microvmIdentifier: loud.microvmId });
    }
  });

  it("microvm logs - the lines outlive the host that stored them: another host answers after it stopped", async () => {
    const { microvmId, talker } = await runTalker();
    await talker.say("kept", 2);
    await readUntil(microvmId, (lines) => lines.includes("kept 2"));
    const other = await svc.addHost();
    await svc.host.close();
    await waitForState(svc.overHttp, microvmId, ["TERMINATED"], 30_000);
    const lines = (await linesOf(microvmId)).map((l) => l.line);
    assert.deepEqual(lines.slice(0, 3), ["talker loaded", "kept 1", "kept 2"]);
    assert.ok(other.host.hostId !== svc.host.hostId);
  });
});

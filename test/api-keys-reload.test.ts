// API keys in a real process: the start-up log says whether keys are on and for how many
// principals; SIGHUP reads the key file again without dropping a request in flight; a file
// that does not parse keeps the old keys and the log says why.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { newApiKey } from "../gateway/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";

const defer = lifo(after);
const alice = newApiKey("alice");
const bob = newApiKey("bob");
const roles = ["--role", "gateway,actors"];

/** Resolves with the first log entry from index `from` on that `matches`; fails after `timeoutMs`. */
function logEntry(svc: ServiceProcess, from: number, matches: (entry: Record<string, unknown>) => boolean) {
  return new Promise<Record<string, unknown>>((resolve, reject) => {
    const check = () => {
      const found = svc.logs.slice(from).find(matches);
      if (!found) return;
      done();
      resolve(found);
    };
    // The helper parses lines on the same stream's events: look after it has.
    const onData = () => setImmediate(check);
    const onExit = () => {
      done();
      reject(new Error("the process exited"));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error("no such log entry within 15 s"));
    }, 15_000);
    const done = () => {
      clearTimeout(timer);
      svc.child.stdout!.off("data", onData);
      svc.child.off("exit", onExit);
    };
    svc.child.stdout!.on("data", onData);
    svc.child.once("exit", onExit);
    check();
  });
}

const getTask = (svc: ServiceProcess, key: string) =>
  fetch(`${svc.taskUrl}/no-such-task`, { headers: { authorization: `Bearer ${key}` } }).then(async (res) => {
    await res.arrayBuffer();
    return res.status;
  });

describe("api keys reload - a real process", () => {
  let svc: ServiceProcess;
  let keysFile: string;
  before(async () => {
    const dir = await mkdtemp(join(tmpdir(), "api-keys-reload-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    keysFile = join(dir, "api-keys");
    await writeFile(keysFile, `${alice.line}\n`);
    svc = await startServiceProcess({ API_KEYS_FILE: keysFile, LOG_FORMAT: "json" }, roles);
    defer(() => svc.stop());
  });

  it("api keys reload - the start-up log says keys are on and for how many principals", () => {
    const entry = svc.logs.find((e) => e.apiKeys === "on");
    assert.ok(entry, "a log line about the keys");
    assert.equal(entry.principals, 1);
    assert.match(String(entry.msg), /API keys on: 1 principal/);
    assert.ok(!JSON.stringify(svc.logs).includes(alice.key), "the key is never logged");
  });

  it("api keys reload - SIGHUP reads the file again, keeping a request in flight", async () => {
    assert.equal(await getTask(svc, bob.key), 401, "bob is not in the file yet");
    // A create whose body is still on its way while the keys are reloaded.
    let stalled = () => undefined as unknown;
    const inFlight = new Promise<number>((resolve, reject) => {
      const req = request(
        `${svc.taskUrl}/`,
        {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${alice.key}` },
        },
        (res) => {
          res.resume();
          resolve(res.statusCode!);
        },
      );
      req.on("error", reject);
      req.write('{"title":');
      stalled = () => req.end('"in flight"}');
    });
    await writeFile(keysFile, `${alice.line}\n${bob.line}\n`);
    const from = svc.logs.length;
    svc.child.kill("SIGHUP");
    const reloaded = await logEntry(svc, from, (e) => /API keys (not )?reloaded/.test(String(e.msg)));
    assert.equal(reloaded.msg, "API keys reloaded");
    assert.equal(reloaded.principals, 2);
    stalled();
    assert.equal(await inFlight, 200, "the request in flight was answered");
    assert.equal(await getTask(svc, bob.key), 404, "bob's new key is known");
    assert.equal(await getTask(svc, alice.key), 404);
    assert.equal(svc.child.exitCode, null, "SIGHUP did not stop the process");
  });

  it("api keys reload - a malformed file keeps the old keys and the log says why", async () => {
    await writeFile(keysFile, `${alice.line}\nbob not-a-hash\n`);
    const from = svc.logs.length;
    svc.child.kill("SIGHUP");
    const refused = await logEntry(svc, from, (e) => /API keys (not )?reloaded/.test(String(e.msg)));
    assert.match(String(refused.msg), /not reloaded: the old keys stay in use/);
    assert.match(String(refused.reason), /line 2/);
    assert.equal(refused.level, 50, "logged as an error");
    assert.equal(await getTask(svc, bob.key), 404, "bob's key from the last good file still opens");
    assert.equal(await getTask(svc, alice.key), 404);
    // A key removed from the next good file is refused after the next reload.
    await writeFile(keysFile, `# only alice now\n${alice.line}\n`);
    const next = svc.logs.length;
    svc.child.kill("SIGHUP");
    assert.equal((await logEntry(svc, next, (e) => e.msg === "API keys reloaded")).principals, 1);
    assert.equal(await getTask(svc, bob.key), 401);
    assert.ok(!JSON.stringify(svc.logs).includes(bob.line.split(" ")[1]!), "no hash in the log");
  });
});

describe("api keys reload - keys off", () => {
  it("api keys reload - without API_KEYS_FILE the start-up log says keys are off", async () => {
    const svc = await startServiceProcess({ API_KEYS_FILE: "", LOG_FORMAT: "json" }, roles);
    defer(() => svc.stop());
    const entry = svc.logs.find((e) => e.apiKeys === "off");
    assert.ok(entry, "a log line about the keys");
    assert.match(String(entry.msg), /API keys off/);
  });
});

// HTTP API keys and owners, over real HTTP: 401 without a known bearer key (preflights, health
// and docs excepted), another principal's instance is a 404, a per-principal quota (429), and
// the microVM API's JSON-only POSTs (415), no CORS and Host check (421).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { runCli } from "../client/cli.ts";
import { httpClient } from "../client/index.ts";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadApiKeys, newApiKey, parseApiKeys } from "../gateway/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  policy,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";
import { startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
after(() => assertNoInstanceLeft());
const alice = newApiKey("alice");
const bob = newApiKey("bob");
const keys = parseApiKeys(`# principals and key hashes\n${alice.line}\n\n${bob.line} # a comment\n`);
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

describe("api keys - the key file", () => {
  it("api keys - a malformed line is refused, naming its number but not its content", () => {
    assert.throws(
      () => parseApiKeys(`${alice.line}\nbob not-a-hash\n`),
      (err: Error) => /line 2/.test(err.message) && !err.message.includes("not-a-hash"),
    );
    assert.throws(() => parseApiKeys(`nats:internal ${"0".repeat(64)}\n`), /line 1/);
  });

  it("taskctl apikey create - prints a key and the line that grants it", async () => {
    let out = "";
    const code = await runCli(["apikey", "create", "carol"], {
      out: (text) => void (out += text),
      err: () => undefined,
      env: {},
    });
    assert.equal(code, 0);
    const key = /key:\s+(\S+)/.exec(out)![1]!;
    const line = /line:\s+(.+)/.exec(out)![1]!;
    const req = { headers: { authorization: `Bearer ${key}` } } as never;
    assert.equal(parseApiKeys(line).principalOf(req), "carol");
    assert.equal(parseApiKeys(line).principalOf({ headers: { authorization: `Bearer ${key}x` } } as never), undefined);
  });
});

describe("api keys - reloads", () => {
  it("api keys - a reload tells the ids of the keys it removed, a key moved to another principal among them", async () => {
    const dir = await mkdtemp(join(tmpdir(), "api-keys-ids-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    const file = join(dir, "keys");
    const [first, second] = [newApiKey("alice"), newApiKey("alice")];
    await writeFile(file, `${first.line}\n${second.line}\n`);
    const keys = await loadApiKeys(file);
    const idOf = (key: string) => keys.keyOf({ headers: bearer(key) } as never)?.keyId;
    const [firstId, secondId] = [idOf(first.key)!, idOf(second.key)!];
    assert.notEqual(firstId, secondId, "each key its own id");
    assert.ok(!firstId.includes(first.line.split(" ")[1]!.slice(0, 8)), "the id is not the key's hash");
    const told: string[][] = [];
    keys.onRevoked((ids) => void told.push([...ids]));
    await writeFile(file, `${second.line}\n`);
    assert.deepEqual(await keys.reload(), [firstId]);
    await writeFile(file, `${second.line.replace("alice", "bob")}\n`);
    assert.deepEqual(await keys.reload(), [secondId], "moved to bob: alice's key is gone");
    assert.notEqual(idOf(second.key), secondId, "bob's key has an id of its own");
    assert.deepEqual(await keys.reload(), [], "nothing removed");
    assert.deepEqual(told, [[firstId], [secondId]], "told only of reloads that removed keys");
  });
});

describe("api keys - task and job APIs", () => {
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { apiKeys: keys });
  });

  it("api keys - a request without a key is 401 Unauthorized, naming the header to send", async () => {
    for (const [url, init] of [
      [`${svc.taskUrl}/`, { method: "POST", body: '{"title":"x"}', headers: { "content-type": "application/json" } }],
      [`${svc.taskUrl}/some-id`, {}],
      [`${svc.jobUrl}/?jobId=x`, {}],
    ] as const) {
      const res = await fetch(url, init);
      assert.equal(res.status, 401, url);
      assert.equal(res.headers.get("www-authenticate"), "Bearer");
      assert.deepEqual(await res.json(), {
        _tag: "Unauthorized",
        message: "missing Authorization: Bearer <key> (taskctl: TASKCTL_API_KEY)",
      });
    }
  });

  it("taskctl - a 401 says to set TASKCTL_API_KEY; with the key the call goes through", async () => {
    const call = async (env: NodeJS.ProcessEnv) => {
      let err = "";
      const code = await runCli(["tasks", "create", "x", "--url", svc.taskUrl], {
        out: () => undefined,
        err: (text) => void (err += text),
        env,
      });
      return { code, err };
    };
    const refused = await call({});
    assert.equal(refused.code, 1);
    assert.match(refused.err, /401 Unauthorized\): set TASKCTL_API_KEY to an API key/);
    assert.deepEqual(await call({ TASKCTL_API_KEY: alice.key }), { code: 0, err: "" });
  });

  it("api keys - a key that is not valid is 401 saying so, the same whichever principal it resembles", async () => {
    const answers = [];
    for (const key of [`${alice.key}x`, "tsk_never-issued", bob.key.slice(0, -1)]) {
      const res = await fetch(`${svc.taskUrl}/some-id`, { headers: bearer(key) });
      assert.equal(res.status, 401);
      assert.equal(res.headers.get("www-authenticate"), "Bearer");
      answers.push(await res.json());
    }
    for (const answer of answers) {
      assert.deepEqual(answer, {
        _tag: "Unauthorized",
        message: "the API key is not valid (sent in Authorization: Bearer <key>)",
      });
    }
    // Another scheme is no bearer key at all.
    const basic = await fetch(`${svc.jobUrl}/?jobId=x`, { headers: { authorization: "Basic YWxpY2U6eA==" } });
    assert.equal(
      ((await basic.json()) as { message: string }).message,
      "missing Authorization: Bearer <key> (taskctl: TASKCTL_API_KEY)",
    );
  });

  it("api keys - a known key passes", async () => {
    const created = await fetch(`${svc.taskUrl}/`, {
      method: "POST",
      body: '{"title":"keyed"}',
      headers: { "content-type": "application/json", ...bearer(alice.key) },
    });
    assert.equal(created.status, 200);
    const task = (await created.json()) as { id: string };
    const read = await fetch(`${svc.taskUrl}/${task.id}`, { headers: bearer(alice.key) });
    assert.equal(read.status, 200);
    await read.arrayBuffer();
    const others = await fetch(`${svc.taskUrl}/${task.id}`, { headers: bearer(bob.key) });
    assert.equal(others.status, 404, "tasks are their principal's: another does not find it");
    await others.arrayBuffer();
    const keyless = await fetch(`${svc.taskUrl}/${task.id}`);
    assert.equal(keyless.status, 401, "a read answered before (and cached) still needs a key");
    await keyless.arrayBuffer();
  });

  it("api keys - a preflight needs no key and allows the Authorization header", async () => {
    const res = await fetch(`${svc.taskUrl}/`, { method: "OPTIONS" });
    assert.equal(res.status, 204);
    assert.equal(
      res.headers.get("access-control-allow-headers"),
      "Content-Type, Idempotency-Key, X-Request-Id, Authorization",
    );
  });

  it("api keys - the OpenAPI document requires the bearer scheme and /docs is open", async () => {
    const doc = (await (await fetch(`${svc.taskUrl}/openapi.json`)).json()) as any;
    assert.deepEqual(doc.components.securitySchemes.bearerAuth, {
      type: "http",
      scheme: "bearer",
      description: doc.components.securitySchemes.bearerAuth.description,
    });
    assert.deepEqual(doc.security, [{ bearerAuth: [] }]);
    assert.equal(doc.paths["/{id}"].get.responses["401"].description, "Unauthorized");
    assert.equal((await fetch(`${svc.taskUrl}/docs`)).status, 200);
  });
});

describe("api keys - microVM owners", () => {
  let vms: MicrovmService;
  before(async () => {
    vms = await startMicrovmService(
      defer,
      { quotaPerPrincipal: 2 },
      { apiKeys: keys, microvmHostNames: ["localhost", "127.0.0.1", "vms.example"] },
    );
  });
  const asAlice = () => httpClient(microvmApi, vms.microvmUrl, { apiKey: alice.key });
  const asBob = () => httpClient(microvmApi, vms.microvmUrl, { apiKey: bob.key });
  const status = (promise: Promise<unknown>) =>
    promise.then(
      () => 200,
      (err: { status: number }) => err.status,
    );

  it("api keys - the microVM API without a key is 401", async () => {
    assert.equal(await status(httpClient(microvmApi, vms.microvmUrl).listMicrovms({})), 401);
  });

  it("microvm owners - another principal's instance is a 404 and absent from its list", async () => {
    const vm = await asAlice().runMicrovm({ idlePolicy: policy() });
    const id = { microvmIdentifier: vm.microvmId };
    assert.equal((await asAlice().getMicrovm(id)).microvmId, vm.microvmId);
    assert.equal(await status(asBob().getMicrovm(id)), 404);
    assert.equal(
      await status(asBob().createAuthToken({ ...id, expirationInMinutes: 1, allowedPorts: [{ port: 8080 }] })),
      404,
    );
    assert.equal(await status(asBob().suspendMicrovm(id)), 404);
    assert.equal(await status(asBob().resumeMicrovm(id)), 404);
    assert.equal(await status(asBob().terminateMicrovm(id)), 404);
    assert.ok(!(await asBob().listMicrovms({})).items.some((item) => item.microvmId === vm.microvmId));
    assert.ok((await asAlice().listMicrovms({})).items.some((item) => item.microvmId === vm.microvmId));
    assert.equal(await status(vms.overNats.getMicrovm(id)), 404, "nats:internal is another principal too");
    assert.equal((await asAlice().terminateMicrovm(id)).state, "TERMINATED");
  });

  it("microvm owners - an Idempotency-Key is scoped to its principal: another's key or instance id is a fresh key", async () => {
    const key = crypto.randomUUID();
    const withKey = (k: string) => ({ idempotencyKey: k });
    const alices = await asAlice().runMicrovm({ idlePolicy: policy() }, withKey(key));
    assert.equal((await asAlice().runMicrovm({ idlePolicy: policy() }, withKey(key))).microvmId, alices.microvmId);
    // Bob sends Alice's instance id, then Alice's own key, with Alice's very request: each launches his own.
    const byId = await asBob().runMicrovm({ idlePolicy: policy() }, withKey(alices.microvmId));
    const byKey = await asBob().runMicrovm({ idlePolicy: policy() }, withKey(key));
    const ids = new Set([alices.microvmId, byId.microvmId, byKey.microvmId]);
    assert.equal(ids.size, 3, "three instances");
    assert.equal((await asBob().getMicrovm({ microvmIdentifier: byKey.microvmId })).microvmId, byKey.microvmId);
    assert.equal(await status(asBob().getMicrovm({ microvmIdentifier: alices.microvmId })), 404);
    assert.equal((await asBob().runMicrovm({ idlePolicy: policy() }, withKey(key))).microvmId, byKey.microvmId);
    // Alice's instance and her key are untouched.
    assert.equal((await asAlice().getMicrovm({ microvmIdentifier: alices.microvmId })).microvmId, alices.microvmId);
    const reused = await asAlice()
      .runMicrovm({ idlePolicy: policy({ autoResumeEnabled: false }) }, withKey(key))
      .then(
        () => undefined,
        (err: { status: number; error: { _tag: string } }) => [err.status, err.error._tag],
      );
    assert.deepEqual(reused, [409, "IdempotencyKeyReused"], "her own key, another request");
    for (const [client, vm] of [
      [asAlice(), alices],
      [asBob(), byId],
      [asBob(), byKey],
    ] as const) {
      await client.terminateMicrovm({ microvmIdentifier: vm.microvmId });
      await waitForState(client, vm.microvmId, ["TERMINATED"], 30_000);
    }
  });

  it("microvm owners - past the per-principal quota RunMicrovm is a 429, other principals unaffected", async () => {
    const live = [
      await asAlice().runMicrovm({ idlePolicy: policy() }),
      await asAlice().runMicrovm({ idlePolicy: policy() }),
    ];
    await assert.rejects(
      asAlice().runMicrovm({ idlePolicy: policy() }),
      (err: { status: number; error: { _tag: string; quota: number } }) => {
        assert.deepEqual([err.status, err.error._tag, err.error.quota], [429, "MicrovmQuotaExceeded", 2]);
        return true;
      },
    );
    const bobs = await asBob().runMicrovm({ idlePolicy: policy() });
    await asAlice().terminateMicrovm({ microvmIdentifier: live[0]!.microvmId });
    // It counts until TERMINATED (a terminate answers TERMINATING when stopping takes over 3 s).
    await waitForState(asAlice(), live[0]!.microvmId, ["TERMINATED"], 30_000);
    const next = await asAlice().runMicrovm({ idlePolicy: policy() });
    await Promise.all([live[1]!, next].map((vm) => asAlice().terminateMicrovm({ microvmIdentifier: vm.microvmId })));
    await asBob().terminateMicrovm({ microvmIdentifier: bobs.microvmId });
  });

  it("microvm api - a POST without content-type application/json is 415", async () => {
    const body = JSON.stringify({ idlePolicy: policy() });
    for (const type of [undefined, "text/plain", "application/x-www-form-urlencoded", "application/merge-patch+json"]) {
      const res = await fetch(`${vms.microvmUrl}/2025-09-09/microvms`, {
        method: "POST",
        body,
        headers: { ...bearer(alice.key), ...(type ? { "content-type": type } : {}) },
      });
      // fetch labels a string body text/plain when no type is given; a Blob of no type, below, sends none.
      assert.equal(res.status, 415, String(type));
      // The Task and Job APIs' 415 has the same words (test/task-api.test.ts).
      assert.deepEqual(await res.json(), {
        _tag: "UnsupportedMediaType",
        message: "content-type must be application/json",
      });
    }
    const noType = await fetch(`${vms.microvmUrl}/2025-09-09/microvms`, {
      method: "POST",
      body: new Blob([body]),
      headers: bearer(alice.key),
    });
    assert.equal(noType.status, 415, "no content type at all");
    await noType.arrayBuffer();
  });

  it("microvm api - sends no CORS allowances", async () => {
    const preflight = await fetch(`${vms.microvmUrl}/2025-09-09/microvms`, {
      method: "OPTIONS",
      headers: { origin: "https://evil.example" },
    });
    assert.equal(preflight.headers.get("access-control-allow-origin"), null);
    assert.equal(preflight.headers.get("access-control-allow-headers"), null);
    await preflight.arrayBuffer();
  });

  it("microvm api - a Host header naming none of its host names is 421", async () => {
    const port = new URL(vms.microvmUrl).port;
    const { request } = await import("node:http");
    const ask = (host: string) =>
      new Promise<number>((resolve, reject) => {
        const req = request(
          { host: "127.0.0.1", port, path: "/2025-09-09/microvms", headers: { host, ...bearer(alice.key) } },
          (res) => {
            res.resume();
            resolve(res.statusCode!);
          },
        );
        req.on("error", reject).end();
      });
    assert.equal(await ask("attacker.example"), 421);
    assert.equal(await ask(`vms.example:${port}`), 200);
  });
});

describe("api keys - start-up", () => {
  it("main - refuses to run the microVM API beyond loopback without keys, saying how to make one", async () => {
    const child = spawn(process.execPath, ["--import", "tsx", "main.ts", "--role", "gateway"], {
      cwd: fileURLToPath(new URL("..", import.meta.url)),
      env: { ...process.env, HOST: "0.0.0.0", API_KEYS_FILE: "", NATS_URL: "nats://127.0.0.1:1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (chunk) => (stderr += chunk));
    const [code] = await once(child, "exit");
    assert.equal(code, 1);
    assert.match(stderr, /needs API keys: make one with `npx taskctl apikey create <principal>`/);
  });
});

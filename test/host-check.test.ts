// DNS rebinding: every API (Task, Job, microVM) answers only the Host names it knows, on
// loopback and without API keys too. A rebinding page reaches 127.0.0.1 under its own name.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { createGateways } from "../gateway/index.ts";
import { hostCheck, hostNameOf } from "../gateway/host-check.ts";
import { connectNats } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, startMicrovmService, type MicrovmService } from "./helpers/microvm.ts";
import { startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
after(() => assertNoInstanceLeft());

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** Sends a request to `url` (a 127.0.0.1 listener) with the given `Host` header, as a rebound browser would. */
function ask(url: string, host: string, init: { method?: string; path?: string; body?: string } = {}) {
  const { port } = new URL(url);
  return new Promise<Answer>((resolve, reject) => {
    const headers: Record<string, string> = { host };
    if (init.body !== undefined) headers["content-type"] = "application/json";
    const req = request(
      { host: "127.0.0.1", port, method: init.method ?? "GET", path: init.path ?? "/", headers },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (body += chunk));
        res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body }));
      },
    );
    req.on("error", reject).end(init.body);
  });
}

async function countKeys(svc: TestService): Promise<number> {
  let count = 0;
  for await (const _ of await svc.buckets.tasks.keys()) count++;
  return count;
}

function assertMisdirected(answer: Answer, what: string): void {
  assert.equal(answer.status, 421, what);
  assert.match(String(answer.headers["content-type"]), /application\/json/, what);
  const body = JSON.parse(answer.body) as { _tag: string; message: string };
  assert.equal(body._tag, "MisdirectedRequest", what);
  assert.match(body.message, /DNS-rebinding/, what);
  assert.doesNotMatch(answer.body, /\bat .*\.ts:\d+/, "no stack");
}

describe("host check - task and job APIs without API keys", () => {
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  it("host check - a rebound name is 421 on the Task API and nothing is created", async () => {
    const before = await countKeys(svc);
    const port = new URL(svc.taskUrl).port;
    const created = await ask(svc.taskUrl, `attacker.example:${port}`, { method: "POST", body: '{"title":"x"}' });
    assertMisdirected(created, "createTask");
    assert.equal(created.headers["access-control-allow-origin"], "*", "CORS headers on errors too");
    assertMisdirected(await ask(svc.taskUrl, `attacker.example:${port}`, { path: "/some-id" }), "getTask");
    assertMisdirected(await ask(svc.taskUrl, "attacker.example", { method: "OPTIONS" }), "preflight");
    const after = await countKeys(svc);
    assert.equal(after, before);
  });

  it("host check - a rebound name is 421 on the Job API", async () => {
    const port = new URL(svc.jobUrl).port;
    assertMisdirected(
      await ask(svc.jobUrl, `attacker.example:${port}`, { method: "POST", body: '{"content":"x"}' }),
      "createJob",
    );
    assertMisdirected(await ask(svc.jobUrl, "127.0.0.1.attacker.example", { path: "/?jobId=x" }), "getJob");
  });

  it("host check - localhost, 127.0.0.1 and [::1] with any port are served", async () => {
    for (const host of ["localhost", "localhost:1", "127.0.0.1:8787", "[::1]", "[::1]:65535", "LocalHost"]) {
      const task = await ask(svc.taskUrl, host, { method: "POST", body: '{"title":"x"}' });
      assert.equal(task.status, 200, `task API, Host ${host}`);
      const job = await ask(svc.jobUrl, host, { path: "/?jobId=missing" });
      assert.equal(job.status, 404, `job API, Host ${host}`);
    }
  });
});

describe("host check - configured names", () => {
  it("host check - a configured name is served by every API, other names are not", async () => {
    const svc = await startService(defer);
    const nats = await connectNats({ ...svc.nats.login("gateway"), name: "test:gateway:names" });
    defer(() => nats.close());
    const gateways = createGateways({ nats, hostNames: ["tasks.example"], microvmHostNames: ["vms.example"] });
    const task = `http://127.0.0.1:${await gateways.task.listen(0, "127.0.0.1")}`;
    defer(() => gateways.task.close());
    const microvm = `http://127.0.0.1:${await gateways.microvm.listen(0, "127.0.0.1")}`;
    defer(() => gateways.microvm.close());
    assert.equal((await ask(task, "tasks.example:443", { method: "POST", body: '{"title":"x"}' })).status, 200);
    assertMisdirected(await ask(task, "vms.example"), "a microVM-only name on the Task API");
    // No microVM host runs here: a served name reaches NATS (503), a foreign one never does.
    assert.equal((await ask(microvm, "vms.example", { path: "/2025-09-09/microvms" })).status, 503);
    assert.equal((await ask(microvm, "tasks.example", { path: "/2025-09-09/microvms" })).status, 503);
    assertMisdirected(await ask(microvm, "other.example", { path: "/2025-09-09/microvms" }), "microVM API");
  });
});

describe("host check - microVM API without API keys", () => {
  let vms: MicrovmService;
  before(async () => {
    // The check comes before any instance: the plain process provider is enough here.
    vms = await startMicrovmService(defer, { provider: "process" });
  });

  it("host check - a rebound page can neither run nor list instances", async () => {
    const port = new URL(vms.microvmUrl).port;
    const run = await ask(vms.microvmUrl, `rebind.attacker.example:${port}`, {
      method: "POST",
      path: "/2025-09-09/microvms",
      body: "{}",
    });
    assertMisdirected(run, "runMicrovm");
    assertMisdirected(
      await ask(vms.microvmUrl, `rebind.attacker.example:${port}`, { path: "/2025-09-09/microvms" }),
      "list",
    );
    assert.deepEqual((await vms.overHttp.listMicrovms({})).items, [], "nothing ran");
    const listed = await ask(vms.microvmUrl, `localhost:${port}`, { path: "/2025-09-09/microvms" });
    assert.equal(listed.status, 200);
  });
});

describe("host check - Host header parsing", () => {
  it("host check - the name is compared without its port, malformed headers name nothing", () => {
    const served = hostCheck(["vms.example", "[fe80::1]"]);
    for (const host of ["localhost", "localhost.:80", "127.0.0.1:80", "[::1]:9", "vms.example:1", "[fe80::1]:3"])
      assert.equal(served(host), true, host);
    for (const host of ["", undefined, "[::1]evil", "127.0.0.2", "localhost.attacker.example", "a:b:c", "fe80::1"])
      assert.equal(served(host), false, String(host));
    assert.equal(hostNameOf("[::1]:80"), "::1");
  });

  it("host check - verdicts kept for repeated headers stay right past many distinct ones", () => {
    const served = hostCheck(["vms.example"]);
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 300; i++) {
        assert.equal(served(`rebound-${i}.example:80`), false);
        if (i % 50 === 0) assert.equal(served(`localhost:${8000 + i}`), true);
      }
      assert.equal(served("vms.example"), true);
      assert.equal(served("VMS.example.:443"), true);
      assert.equal(served("vms.example.attacker"), false);
    }
  });
});

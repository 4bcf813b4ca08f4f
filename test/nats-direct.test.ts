// Internal services calling the actors straight over NATS: subjects, bodies, error headers.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { headers } from "@nats-io/transport-node";
import { nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

describe("nats direct", () => {
  const defer = lifo(after);
  let svc: TestService;
  const request = async (subject: string, body: string | Uint8Array, h?: Record<string, string>) => {
    const hdrs = headers();
    for (const [k, v] of Object.entries(h ?? {})) hdrs.set(k, v);
    const msg = await svc.handle.nc.request(subject, body, { timeout: 5_000, headers: hdrs });
    return {
      code: msg.headers?.get("Nats-Service-Error-Code") ?? "",
      tag: msg.headers?.get("Nats-Service-Error") ?? "",
      body: msg.data.length ? msg.json<unknown>() : undefined,
    };
  };
  before(async () => {
    svc = await startService(defer);
  });

  it("nats direct - tasks.create then tasks.get", async () => {
    const created = await request("tasks.create", JSON.stringify({ title: "over nats" }));
    assert.equal(created.code, "");
    const task = created.body as { id: string; title: string; completed: boolean };
    assert.equal(task.title, "over nats");
    assert.equal(task.completed, false);
    assert.deepEqual((await request("tasks.get", JSON.stringify({ id: task.id }))).body, task);
  });

  it("nats direct - a missing task answers error headers and the TaskNotFound body", async () => {
    const res = await request("tasks.get", JSON.stringify({ id: "absent" }));
    assert.equal(res.code, "404");
    assert.equal(res.tag, "TaskNotFound");
    assert.deepEqual(res.body, { _tag: "TaskNotFound", id: "absent", message: 'no task "absent"' });
  });

  it("nats direct - task objects by base64url name token", async () => {
    const name = "team/α.β";
    const created = await request(`taskobjects.${nameToken(name)}.create`, JSON.stringify({ title: "do" }));
    const task = created.body as { id: string };
    assert.equal(created.code, "");
    assert.deepEqual((await request(`taskobjects.${nameToken(name)}.get`, JSON.stringify({ id: task.id }))).body, task);
    const elsewhere = await request(`taskobjects.${nameToken("other")}.get`, JSON.stringify({ id: task.id }));
    assert.equal(elsewhere.code, "404");
  });

  it("nats direct - jobs.create then jobs.get", async () => {
    const created = await request("jobs.create", JSON.stringify({ content: "c" }));
    assert.equal(typeof created.body, "string");
    const read = await request("jobs.get", JSON.stringify({ jobId: created.body }));
    assert.deepEqual(read.body, { id: created.body, content: "c" });
    const missing = await request("jobs.get", JSON.stringify({ jobId: "none" }));
    assert.equal(missing.code, "404");
    assert.equal(missing.tag, "JobNotFound");
  });

  it("nats direct - bad input gets the same 400 as HTTP", async () => {
    const cases: [string, string | Uint8Array, string][] = [
      ["tasks.create", "{}", "Missing"],
      ["tasks.create", JSON.stringify({ title: 1 }), "Type"],
      ["tasks.create", "not json", "Type"],
      ["tasks.create", "[1,2]", "Type"],
      ["tasks.get", "", "Missing"],
      ["jobs.get", JSON.stringify({ jobId: 5 }), "Type"],
      ["jobs.create", new Uint8Array([0xff, 0xfe, 0x00]), "Type"],
      ["taskobjects.!!!.get", JSON.stringify({ id: "x" }), "Type"],
      ["taskobjects.YQ==.get", JSON.stringify({ id: "x" }), "Type"],
      [`taskobjects.${nameToken("n".repeat(300))}.create`, JSON.stringify({ title: "t" }), "Type"],
    ];
    for (const [subject, body, issue] of cases) {
      const res = await request(subject, body);
      assert.equal(res.code, "400", `${subject} ${String(body).slice(0, 20)}`);
      assert.equal(res.tag, "HttpApiDecodeError");
      const error = res.body as { _tag: string; issues: { _tag: string }[] };
      assert.equal(error._tag, "HttpApiDecodeError");
      assert.equal(error.issues[0]!._tag, issue, subject);
    }
  });

  it("nats direct - the Idempotency-Key header fixes the created id", async () => {
    const key = "2c1f4e1a-8d3b-4c55-9f0e-6a7b8c9d0e1f";
    const a = await request("jobs.create", JSON.stringify({ content: "k" }), { "Idempotency-Key": key });
    const b = await request("jobs.create", JSON.stringify({ content: "k" }), { "Idempotency-Key": key });
    assert.equal(a.body, key);
    assert.equal(b.body, key);
    const clash = await request("jobs.create", JSON.stringify({ content: "other" }), { "Idempotency-Key": key });
    assert.equal(clash.code, "409");
  });
});

// Whose data: with API keys on, tasks, task objects and jobs belong to the principal that wrote
// them (another gets 404 and never sees them listed), over HTTP and over NATS; the gateway's
// copies of the subjects are the gateway's alone; without keys every caller is the anonymous
// principal, and data in the layout written before owners existed reads as that principal's.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { watchJobs } from "../client/index.ts";
import { newApiKey, parseApiKeys } from "../gateway/index.ts";
import { connectNats, type NatsHandle } from "../platform/index.ts";
import { getTask, nameToken, PRINCIPAL_HEADER, requestSubject, viaGateway } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
const alice = newApiKey("alice");
const bob = newApiKey("bob");
// A key of the principal `anonymous`: the owner of the data written without keys.
const legacy = newApiKey("anonymous");
const keys = parseApiKeys(`${alice.line}\n${bob.line}\n${legacy.line}\n`);

interface Answer {
  status: number;
  body: Record<string, unknown> & { items?: Record<string, unknown>[] };
}

/** An HTTP request with `key` (none: no Authorization header); the status and the parsed body. */
async function call(method: string, url: string, key?: string, body?: unknown): Promise<Answer> {
  const res = await fetch(url, {
    method,
    headers: {
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : {} };
}

/** The ids of a list answer's items. */
const ids = (answer: Answer) => (answer.body.items ?? []).map((item) => item.id ?? item.name);

/** A NATS request as `nc`'s user: the error code (empty on success) and the JSON body. */
async function natsCall(nats: NatsHandle, subject: string, body: unknown, hdrs: Record<string, string> = {}) {
  const h = natsHeaders();
  for (const [k, v] of Object.entries(hdrs)) h.set(k, v);
  const msg = await nats.nc.request(subject, JSON.stringify(body), { timeout: 5_000, headers: h });
  return { code: msg.headers?.get("Nats-Service-Error-Code") ?? "", body: msg.json<Record<string, unknown>>() };
}

/** A task, a task-object task and a job as the release before owners wrote them (its key layout). */
const old = { id: "written-before-owners", title: "old", completed: false };
async function writeEarlier(buckets: TestService["buckets"]): Promise<void> {
  await buckets.tasks.create(old.id, JSON.stringify(old));
  await buckets.taskObjects.create(`${nameToken("default")}.${old.id}`, JSON.stringify(old));
  await buckets.jobs.create(old.id, JSON.stringify({ id: old.id, content: "old job" }));
}

describe("owners - with API keys", () => {
  let svc: TestService;
  let internal: NatsHandle;
  before(async () => {
    svc = await startService(defer, { apiKeys: keys, earlier: writeEarlier });
    internal = await connectNats({ ...svc.nats.login("internal"), name: "test:internal" });
    defer(() => internal.close());
  });

  it("owners - another principal's task is a 404 to get, update and delete, and absent from its list", async () => {
    const created = await call("POST", `${svc.taskUrl}/`, alice.key, { title: "alice's" });
    assert.equal(created.status, 200);
    const id = created.body.id as string;
    const url = `${svc.taskUrl}/${id}`;
    // Read twice first: the gateway keeps the answer, and must not send it to bob.
    assert.equal((await call("GET", url, alice.key)).status, 200);
    assert.equal((await call("GET", url, alice.key)).status, 200);
    for (const [method, body] of [["GET"], ["PATCH", { completed: true }], ["DELETE"]] as const) {
      const answer = await call(method, url, bob.key, body);
      assert.equal(answer.status, 404, `${method} by bob`);
      assert.deepEqual(answer.body._tag, "TaskNotFound");
    }
    const bobs = await call("POST", `${svc.taskUrl}/`, bob.key, { title: "bob's" });
    const bobList = await call("GET", `${svc.taskUrl}/?limit=1000`, bob.key);
    assert.deepEqual(ids(bobList), [bobs.body.id], "bob lists his own task only");
    // Alice's task is as she wrote it, and hers alone is in her list.
    assert.deepEqual((await call("GET", url, alice.key)).body, { id, title: "alice's", completed: false });
    assert.deepEqual(ids(await call("GET", `${svc.taskUrl}/?limit=1000`, alice.key)), [id]);
    assert.equal((await call("DELETE", url, alice.key)).status, 204);
  });

  it("owners - a list's cursor is its principal's: another principal's is refused", async () => {
    for (let i = 0; i < 3; i++) await call("POST", `${svc.taskUrl}/`, alice.key, { title: `page ${i}` });
    const page = await call("GET", `${svc.taskUrl}/?limit=1`, alice.key);
    assert.equal(typeof page.body.cursor, "string");
    const cursor = encodeURIComponent(page.body.cursor as string);
    assert.equal((await call("GET", `${svc.taskUrl}/?limit=1&cursor=${cursor}`, alice.key)).status, 200);
    assert.equal((await call("GET", `${svc.taskUrl}/?limit=1&cursor=${cursor}`, bob.key)).status, 400);
  });

  it("owners - another principal's job is a 404", async () => {
    const created = await call("POST", `${svc.jobUrl}/`, alice.key, { content: "alice's job" });
    assert.equal(created.status, 200);
    const url = `${svc.jobUrl}/?jobId=${created.body as unknown as string}`;
    assert.equal((await call("GET", url, alice.key)).status, 200);
    const answer = await call("GET", url, bob.key);
    assert.equal(answer.status, 404);
    assert.equal(answer.body._tag, "JobNotFound");
    assert.equal((await call("GET", url, alice.key)).body.content, "alice's job");
  });

  it("owners - the job-created feed names the owner of each job", async () => {
    let created!: Promise<Answer>;
    const watch = watchJobs(internal.nc, {
      onWatching: () => (created = call("POST", `${svc.jobUrl}/`, alice.key, { content: "watched" })),
    });
    for await (const job of watch) {
      assert.deepEqual(
        { id: job.id, content: job.content, owner: job.owner },
        { id: (await created).body as unknown as string, content: "watched", owner: "alice" },
      );
      break;
    }
  });

  it("owners - two principals' task objects of one name are two objects with their own storage", async () => {
    const name = "shared-name";
    const created = await call("POST", `${svc.taskUrl}/do?name=${name}`, alice.key, { title: "in alice's" });
    assert.equal(created.status, 200);
    const id = created.body.id as string;
    const url = `${svc.taskUrl}/do/${id}?name=${name}`;
    assert.equal((await call("GET", url, alice.key)).status, 200);
    assert.equal((await call("GET", url, alice.key)).status, 200);
    for (const [method, body] of [["GET"], ["PATCH", { title: "bob was here" }], ["DELETE"]] as const) {
      assert.equal((await call(method, url, bob.key, body)).status, 404, `${method} by bob`);
    }
    const bobs = await call("POST", `${svc.taskUrl}/do?name=${name}`, bob.key, { title: "in bob's" });
    assert.equal(bobs.status, 200);
    const list = (key: string) => call("GET", `${svc.taskUrl}/do/tasks?name=${name}`, key);
    assert.deepEqual(ids(await list(bob.key)), [bobs.body.id]);
    assert.deepEqual(ids(await list(alice.key)), [id]);
    assert.deepEqual((await call("GET", url, alice.key)).body, { id, title: "in alice's", completed: false });
    // Each principal's directory: the name with its own count; the other's names absent.
    const described = (key: string) => call("GET", `${svc.taskUrl}/do/objects/${name}`, key);
    assert.equal((await described(alice.key)).body.tasks, 1);
    assert.equal((await described(bob.key)).body.tasks, 1);
    await call("POST", `${svc.taskUrl}/do?name=alice-only`, alice.key, { title: "x" });
    assert.equal((await call("GET", `${svc.taskUrl}/do/objects/alice-only`, bob.key)).status, 404);
    const names = async (key: string) => ids(await call("GET", `${svc.taskUrl}/do/objects?limit=1000`, key));
    assert.deepEqual(await names(bob.key), [name]);
    assert.deepEqual((await names(alice.key)).sort(), ["alice-only", name]);
  });

  it("owners - over NATS the caller is its NATS user: neither sees the other's data", async () => {
    const created = await call("POST", `${svc.taskUrl}/`, alice.key, { title: "alice's, not nats'" });
    const id = created.body.id as string;
    assert.equal((await natsCall(internal, "tasks.get", { id })).code, "404");
    assert.equal((await natsCall(internal, "tasks.update", { id, completed: true })).code, "404");
    assert.equal((await natsCall(internal, "tasks.delete", { id })).code, "404");
    const own = await natsCall(internal, "tasks.create", { title: "nats'" });
    assert.equal(own.code, "");
    assert.deepEqual((await natsCall(internal, "tasks.get", { id: own.body.id })).body, own.body);
    const listed = await natsCall(internal, "tasks.list", { limit: 1000 });
    assert.ok(!ids({ status: 200, body: listed.body }).includes(id), "alice's task is not in the NATS user's list");
    assert.equal((await call("GET", `${svc.taskUrl}/${own.body.id as string}`, alice.key)).status, 404);
    const object = `taskobjects.${nameToken("default")}`;
    const inObject = await natsCall(internal, `${object}.create`, { title: "nats' default" });
    assert.equal((await call("GET", `${svc.taskUrl}/do/${inObject.body.id as string}`, alice.key)).status, 404);
    const job = await natsCall(internal, "jobs.create", { content: "nats' job" });
    assert.equal((await call("GET", `${svc.jobUrl}/?jobId=${job.body as unknown as string}`, alice.key)).status, 404);
  });

  it("owners - only the gateway may send on its copies: a forged principal is a permissions violation", async () => {
    const created = await call("POST", `${svc.taskUrl}/`, alice.key, { title: "not for forgers" });
    const subject = requestSubject(viaGateway(getTask), { id: created.body.id });
    const forged = natsHeaders();
    forged.set(PRINCIPAL_HEADER, "alice");
    await assert.rejects(
      internal.nc.request(subject, JSON.stringify({ id: created.body.id }), { timeout: 2_000, headers: forged }),
      (err: Error) => /permission/i.test(`${err.message} ${String((err as { cause?: unknown }).cause)}`),
    );
  });

  it("owners - data written before owners is the anonymous principal's: no named principal reads it", async () => {
    // Written by the previous release before this service started (`earlier` above).
    assert.equal((await call("GET", `${svc.taskUrl}/${old.id}`, alice.key)).status, 404);
    assert.equal((await call("GET", `${svc.taskUrl}/do/${old.id}`, alice.key)).status, 404);
    assert.equal((await call("GET", `${svc.jobUrl}/?jobId=${old.id}`, alice.key)).status, 404);
    assert.ok(!ids(await call("GET", `${svc.taskUrl}/?limit=1000`, alice.key)).includes(old.id));
    // The key of the principal named `anonymous` is the one that reads it.
    assert.deepEqual((await call("GET", `${svc.taskUrl}/${old.id}`, legacy.key)).body, old);
    assert.deepEqual((await call("GET", `${svc.taskUrl}/do/${old.id}`, legacy.key)).body, old);
    assert.equal((await call("GET", `${svc.jobUrl}/?jobId=${old.id}`, legacy.key)).body.content, "old job");
    assert.deepEqual(ids(await call("GET", `${svc.taskUrl}/?limit=1000`, legacy.key)), [old.id]);
  });
});

describe("owners - without API keys", () => {
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { earlier: writeEarlier });
  });

  it("owners - data in the layout written before owners reads as it did, and NATS and HTTP callers are one", async () => {
    // Written by the previous release before this service started (`earlier` above).
    assert.deepEqual((await call("GET", `${svc.taskUrl}/${old.id}`)).body, old);
    assert.deepEqual((await call("GET", `${svc.taskUrl}/do/${old.id}`)).body, old);
    assert.equal((await call("GET", `${svc.jobUrl}/?jobId=${old.id}`)).body.content, "old job");
    assert.deepEqual(ids(await call("GET", `${svc.taskUrl}/?limit=1000`)), [old.id]);
    assert.deepEqual(ids(await call("GET", `${svc.taskUrl}/do/objects`)), ["default"]);
    // A task created over NATS is read over HTTP, stored under the key without owners.
    const internal = await connectNats({ ...svc.nats.login("internal"), name: "test:internal" });
    defer(() => internal.close());
    const created = await natsCall(internal, "tasks.create", { title: "over nats" });
    assert.deepEqual((await call("GET", `${svc.taskUrl}/${created.body.id as string}`)).body, created.body);
    assert.ok(await svc.buckets.tasks.get(created.body.id as string), "stored as before owners");
  });
});

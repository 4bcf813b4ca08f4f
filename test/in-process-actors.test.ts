// A gateway beside the actors (as `npm start` runs them) hands them its requests in the process:
// the same answers as through a gateway whose requests go over NATS, none of them on NATS.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { createGateways, newApiKey, parseApiKeys } from "../gateway/index.ts";
import { connectNats } from "../platform/index.ts";
import { jobApi, subscriptionSubject, taskApi, viaGateway } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

const alice = newApiKey("alice");
const bob = newApiKey("bob");
const apiKeys = parseApiKeys(`${alice.line}\n${bob.line}\n`);

interface Answer {
  status: number;
  etag: string | null;
  body: unknown;
}

describe("in-process actors", () => {
  const defer = lifo(after);
  let svc: TestService;
  let far: { task: string; job: string };
  const seen: string[] = [];

  before(async () => {
    svc = await startService(defer, { apiKeys, inProcess: true });
    // A second gateway with no actors beside it: its requests go over NATS.
    const nats = await connectNats({ ...svc.nats.login("gateway"), name: "test:far-gateway" });
    defer(() => nats.close());
    const gateways = createGateways({ nats, apiKeys });
    far = {
      task: `http://127.0.0.1:${await gateways.task.listen(0, "127.0.0.1")}`,
      job: `http://127.0.0.1:${await gateways.job.listen(0, "127.0.0.1")}`,
    };
    defer(() => gateways.job.close());
    defer(() => gateways.task.close());
    // Every request either gateway sends to the actors over NATS.
    for (const op of [...Object.values(taskApi), ...Object.values(jobApi)]) {
      const sub = svc.handle.nc.subscribe(subscriptionSubject(viaGateway(op)), {
        callback: (_err, msg) => {
          seen.push(msg.subject);
        },
      });
      defer(() => sub.unsubscribe());
    }
    await svc.handle.nc.flush();
  });

  const overNats = async () => {
    await svc.handle.nc.flush();
    return seen.length;
  };

  async function call(url: string, method: string, path: string, key: string, body?: unknown, headers = {}) {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, etag: res.headers.get("etag"), body: text ? JSON.parse(text) : undefined };
  }

  /**
   * One walk through the task and job operations on the gateway at `api`, each answer with the ids
   * it made replaced by their names, so two walks compare.
   */
  async function walk(api: { task: string; job: string }): Promise<Record<string, Answer>> {
    const t = (method: string, path: string, key: string, body?: unknown, headers = {}) =>
      call(api.task, method, path, key, body, headers);
    const out: Record<string, Answer> = {};
    const created = await t("POST", "/", alice.key, { title: "first" });
    const id = (created.body as { id: string }).id;
    // Revisions are the bucket's stream sequences: named by how far past the create's they are.
    const first = Number(created.etag?.replaceAll('"', ""));
    const key = randomUUID();
    const named = (answer: Answer): Answer =>
      JSON.parse(
        JSON.stringify(answer)
          .replaceAll(id, "<id>")
          .replaceAll(key, "<key>")
          .replace(/\\"(\d+)\\"/g, (_, n) => `\\"+${Number(n) - first}\\"`)
          .replace(/revision (\d+)/g, (_, n) => `revision +${Number(n) - first}`)
          .replace(/"revision":(\d+)/g, (_, n) => `"revision":"+${Number(n) - first}"`),
      );
    out.create = named(created);
    const once = await t("POST", "/", alice.key, { title: "keyed" }, { "idempotency-key": key });
    const again = await t("POST", "/", alice.key, { title: "keyed" }, { "idempotency-key": key });
    assert.deepEqual(again, once, "a repeat of a keyed create answers the first");
    out.keyedAgain = named(again);
    out.keyReused = named(await t("POST", "/", alice.key, { title: "other" }, { "idempotency-key": key }));
    out.keyNotUuid = await t("POST", "/", alice.key, { title: "x" }, { "idempotency-key": "not-a-uuid" });
    out.othersRead = named(await t("GET", `/${id}`, bob.key));
    out.othersUpdate = named(await t("PATCH", `/${id}`, bob.key, { completed: true }));
    out.staleUpdate = named(await t("PATCH", `/${id}`, alice.key, { completed: true }, { "if-match": '"999"' }));
    out.update = named(await t("PATCH", `/${id}`, alice.key, { completed: true }, { "if-match": created.etag! }));
    const listed = await t("GET", "/?limit=10", alice.key);
    out.list = { ...listed, body: (listed.body as { items: { title: string }[] }).items.map((item) => item.title) };
    out.othersList = await t("GET", "/?limit=10", bob.key);
    out.othersDelete = named(await t("DELETE", `/${id}`, bob.key));
    out.delete = named(await t("DELETE", `/${id}`, alice.key));
    out.gone = named(await t("GET", `/${id}`, alice.key));
    const job = await call(api.job, "POST", "/", alice.key, { content: "work" });
    out.job = { ...job, body: typeof job.body };
    const jobId = job.body as string;
    out.getJob = JSON.parse(
      JSON.stringify(await call(api.job, "GET", `/?jobId=${jobId}`, alice.key)).replaceAll(jobId, "<job>"),
    );
    out.othersJob = JSON.parse(
      JSON.stringify(await call(api.job, "GET", `/?jobId=${jobId}`, bob.key)).replaceAll(jobId, "<job>"),
    );
    return out;
  }

  it("in-process actors - a gateway beside the actors answers as one over NATS, without sending on NATS", async () => {
    const here = await walk({ task: svc.taskUrl, job: svc.jobUrl });
    assert.equal(await overNats(), 0, `requests of the gateway beside the actors went over NATS: ${seen.join(", ")}`);
    // Each of alice's lists holds what its walk created; bob's walks see none of them.
    const there = await walk(far);
    assert.ok((await overNats()) > 0, "the far gateway's requests go over NATS");
    // The far walk's list holds both walks' tasks (one principal): compare the rest as they are.
    assert.deepEqual(here.list!.body, ["first", "keyed"]);
    assert.deepEqual(there.list!.body, ["keyed", "first", "keyed"]);
    here.list = there.list = { status: here.list!.status, etag: null, body: null };
    assert.deepEqual(here, there);
    assert.equal(here.create!.status, 200);
    assert.equal(here.keyReused!.status, 409);
    assert.equal(here.keyNotUuid!.status, 400);
    assert.equal(here.othersUpdate!.status, 404);
    assert.equal(here.staleUpdate!.status, 412);
    assert.equal(here.update!.status, 200);
    assert.equal(here.delete!.status, 204);
    assert.equal(here.getJob!.status, 200);
    assert.equal(here.othersJob!.status, 404);
  });
});

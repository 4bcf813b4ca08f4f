// updateTask and the revisions of tasks over real HTTP, NATS and KV: PATCH, ETag, If-Match
// (412), and reads that never go back in time, through the gateway that wrote and another one.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { gatewayDispatch } from "../actors/index.ts";
import { ClientError, httpClient, natsClient } from "../client/index.ts";
import { ANONYMOUS, nameToken, taskApi } from "../schemas/index.ts";
import { createGateways, READ_CACHE_STALE_MS, type LocalReads } from "../gateway/index.ts";
import { connectNats, recordStores } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { getJson, natsRequest, postJson, startService, type TestService } from "./helpers/service.ts";

type Task = { id: string; title: string; completed: boolean };

async function send(url: string, method: string, body?: unknown, extra: Record<string, string> = {}) {
  const res = await fetch(url, {
    method,
    headers: { "content-type": "application/json", ...extra },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, etag: res.headers.get("etag"), body: text ? (JSON.parse(text) as unknown) : undefined };
}

describe("task updates", () => {
  const defer = lifo(after);
  let svc: TestService;
  let other: { url: string; reads: LocalReads };
  before(async () => {
    svc = await startService(defer);
    // A second gateway on its own connection, as another gateway process would run.
    const nats = await connectNats({ ...svc.nats.login("gateway"), name: "test:gateway-2" });
    defer(() => nats.close());
    const gateways = createGateways({ nats, ...gatewayDispatch(recordStores(nats.requester)) });
    const port = await gateways.task.listen(0, "127.0.0.1");
    defer(() => gateways.task.close());
    other = { url: `http://127.0.0.1:${port}`, reads: gateways.reads! };
  });

  const create = async (title: string) => {
    const res = await postJson(`${svc.taskUrl}/`, { title });
    return { task: res.body as Task, etag: res.headers.get("etag")! };
  };

  it("task updates - PATCH changes title and/or completed, answers the Task with a new ETag", async () => {
    const { task, etag } = await create("draft");
    assert.match(etag, /^"\d+"$/);
    const done = await send(`${svc.taskUrl}/${task.id}`, "PATCH", { completed: true });
    assert.equal(done.status, 200);
    assert.deepEqual(done.body, { ...task, completed: true });
    assert.notEqual(done.etag, etag);
    const renamed = await send(`${svc.taskUrl}/${task.id}`, "PATCH", { title: "final", completed: false, extra: 1 });
    assert.deepEqual(renamed.body, { id: task.id, title: "final", completed: false });
    const read = await send(`${svc.taskUrl}/${task.id}`, "GET");
    assert.deepEqual([read.body, read.etag], [renamed.body, renamed.etag]);
  });

  it("task updates - PATCH with no field or a wrong type is 400; of an unknown id 404", async () => {
    const { task } = await create("x");
    for (const body of [{}, { completed: "yes" }, { title: 1 }, { other: true }]) {
      const res = await send(`${svc.taskUrl}/${task.id}`, "PATCH", body);
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.equal((res.body as { _tag: string })._tag, "HttpApiDecodeError");
    }
    // No field: the message names the fields to send, and quotes nothing of the task or the request.
    const empty = await send(`${svc.taskUrl}/${task.id}`, "PATCH", {});
    assert.deepEqual(empty.body, {
      _tag: "HttpApiDecodeError",
      issues: [{ _tag: "Missing", path: [], message: "send title or completed" }],
      message: "send title or completed",
    });
    const missing = await send(`${svc.taskUrl}/no-such-task`, "PATCH", { completed: true });
    assert.equal(missing.status, 404);
    assert.deepEqual(missing.body, { _tag: "TaskNotFound", id: "no-such-task", message: 'no task "no-such-task"' });
  });

  it("task updates - If-Match of a moved revision is 412 PreconditionFailed on PATCH and DELETE", async () => {
    const { task, etag } = await create("contended");
    const first = await send(`${svc.taskUrl}/${task.id}`, "PATCH", { title: "mine" }, { "if-match": etag });
    assert.equal(first.status, 200);
    const current = Number(JSON.parse(first.etag!));
    const late = await send(`${svc.taskUrl}/${task.id}`, "PATCH", { title: "theirs" }, { "if-match": etag });
    assert.equal(late.status, 412);
    assert.deepEqual(late.body, {
      _tag: "PreconditionFailed",
      id: task.id,
      revision: current,
      message: `task "${task.id}" is at revision ${current}, not the one If-Match names`,
    });
    assert.equal((await send(`${svc.taskUrl}/${task.id}`, "DELETE", undefined, { "if-match": etag })).status, 412);
    assert.equal(
      (await send(`${svc.taskUrl}/${task.id}`, "DELETE", undefined, { "if-match": "nonsense" })).status,
      412,
    );
    assert.deepEqual((await getJson(`${svc.taskUrl}/${task.id}`)).body, { ...task, title: "mine" });
    assert.equal(
      (await send(`${svc.taskUrl}/${task.id}`, "DELETE", undefined, { "if-match": first.etag! })).status,
      204,
    );
  });

  it("task updates - a repeated PATCH or DELETE (one Idempotency-Key) answers as the first did, written once", async () => {
    const { task, etag } = await create("retried");
    const key = crypto.randomUUID();
    const url = `${svc.taskUrl}/${task.id}`;
    const headers = { "if-match": etag, "idempotency-key": key };
    const first = await send(url, "PATCH", { completed: true }, headers);
    const again = await send(url, "PATCH", { completed: true }, headers);
    assert.deepEqual([first.status, again.status], [200, 200]);
    assert.deepEqual(
      [again.body, again.etag],
      [first.body, first.etag],
      "the first write's answer, not a second write",
    );
    const other = await send(
      url,
      "PATCH",
      { title: "x" },
      { "if-match": etag, "idempotency-key": crypto.randomUUID() },
    );
    assert.equal(other.status, 412);
    const deleteKey = { "if-match": first.etag!, "idempotency-key": crypto.randomUUID() };
    assert.equal((await send(url, "DELETE", undefined, deleteKey)).status, 204);
    assert.equal((await send(url, "DELETE", undefined, deleteKey)).status, 204);
    assert.equal((await send(url, "DELETE", undefined)).status, 404);
  });

  it("task updates - over NATS: tasks.update answers the Revision header; If-Match 412; 404; 400", async () => {
    const { task } = await create("nats");
    const request = (subject: string, body: unknown, h: Record<string, string> = {}) =>
      natsRequest(svc, subject, body, h);
    const updated = await request("tasks.update", { id: task.id, completed: true });
    assert.deepEqual(updated.body, { ...task, completed: true });
    assert.match(updated.revision, /^\d+$/);
    const read = await request("tasks.get", { id: task.id });
    assert.equal(read.revision, updated.revision);
    const stale = await request(
      "tasks.update",
      { id: task.id, title: "t" },
      { "If-Match": String(+updated.revision - 1) },
    );
    assert.deepEqual(
      [stale.code, stale.body?._tag, stale.body?.revision],
      ["412", "PreconditionFailed", +updated.revision],
    );
    assert.equal((await request("tasks.update", { id: "nope", title: "t" })).code, "404");
    assert.equal((await request("tasks.update", { id: task.id })).code, "400");
    const deleted = await request("tasks.delete", { id: task.id }, { "If-Match": updated.revision });
    assert.deepEqual([deleted.code, deleted.body], ["", null]);
  });

  it("task updates - after PATCH and DELETE, reads through the same gateway never answer the old task", async () => {
    const { task } = await create("cached");
    await getJson(`${svc.taskUrl}/${task.id}`); // kept by this gateway now
    await getJson(`${svc.taskUrl}/${task.id}?unknown=field`); // and under another URL
    await send(`${svc.taskUrl}/${task.id}`, "PATCH", { completed: true });
    for (const url of [`${svc.taskUrl}/${task.id}`, `${svc.taskUrl}/${task.id}?unknown=field`])
      assert.deepEqual((await getJson(url)).body, { ...task, completed: true }, url);
    assert.equal((await send(`${svc.taskUrl}/${task.id}`, "DELETE")).status, 204);
    assert.equal((await getJson(`${svc.taskUrl}/${task.id}`)).status, 404);
  });

  for (const [label, object] of [
    ["a task", undefined],
    ["a task object's task", "two-gateways"],
  ] as const) {
    it(`task updates - another gateway answers a PATCH, then a DELETE of ${label}, within ${READ_CACHE_STALE_MS} ms`, async () => {
      const created = await postJson(`${svc.taskUrl}/${object ? `do?name=${object}` : ""}`, { title: "two gateways" });
      const task = created.body as Task;
      const path = object ? `/do/${task.id}?name=${object}` : `/${task.id}`;
      const record = object ? `taskobjects.${nameToken(object)}.${task.id}` : `tasks.${task.id}`;
      const url = `${other.url}${path}`;
      assert.deepEqual((await getJson(url)).body, task); // kept by the other gateway now
      /** Resolves once the other gateway saw a write of the record newer than `revision`. */
      const seenAfter = (revision: number) =>
        new Promise<void>((resolve) => {
          const check = () => {
            if ((other.reads.revisionSeen(record) ?? 0) <= revision) return;
            other.reads.events.off("written", check);
            resolve();
          };
          other.reads.events.on("written", check);
          check();
        });
      for (const method of ["PATCH", "DELETE"]) {
        const held = Number(JSON.parse((await getJson(url)).headers.get("etag")!));
        const started = performance.now();
        const answer = await send(
          `${svc.taskUrl}${path}`,
          method,
          method === "PATCH" ? { completed: true } : undefined,
        );
        const acked = performance.now();
        // Waits for the other gateway's notice, at most the bound: the read sent then must answer
        // the write (sent at the bound, it must too, notice or not).
        await Promise.race([seenAfter(held), once(AbortSignal.timeout(READ_CACHE_STALE_MS), "abort")]);
        const ms = performance.now() - acked;
        const read = await getJson(url);
        console.log(
          `${label}: the other gateway current ${ms.toFixed(1)} ms after the ack (the ${method} took ` +
            `${(acked - started).toFixed(1)} ms)`,
        );
        if (method === "DELETE") assert.deepEqual([answer.status, read.status], [204, 404]);
        else assert.deepEqual(read.body, { ...task, completed: true });
      }
      assert.equal((await getJson(`${svc.taskUrl}${path}`)).status, 404);
    });
  }

  it(`task updates - a gateway that gets no change notice at all still answers a PATCH's task within ${READ_CACHE_STALE_MS} ms, and keeps answers while nothing is written`, async () => {
    // Its feed subscription is refused (a prefix the gateway role may not subscribe under), so
    // every notice is lost: only the feed's check can tell it that its bucket moved.
    const nats = await connectNats({ ...svc.nats.login("gateway"), name: "test:gateway-deaf" });
    try {
      const deaf = createGateways({ nats, prefix: "deaf", ...gatewayDispatch(recordStores(nats.requester)) });
      const port = await deaf.task.listen(0, "127.0.0.1");
      try {
        const { task } = await create("unheard");
        const url = `http://127.0.0.1:${port}/${task.id}`;
        // Kept once the bucket is confirmed (its first check): sent again from memory.
        for (const deadline = performance.now() + 5_000; ; ) {
          assert.deepEqual((await getJson(url)).body, task);
          if (deaf.reads!.recall(taskApi.getTask.api, `/${task.id}`, ANONYMOUS)) break;
          assert.ok(performance.now() < deadline, "the deaf gateway never kept the answer");
          await new Promise((r) => setTimeout(r, 50));
        }
        const patched = await send(`${svc.taskUrl}/${task.id}`, "PATCH", { completed: true });
        const acked = performance.now();
        // Until a read sent later than the bound after the ack answers (a slow answer to a read
        // sent within it may still be the old task).
        let body: unknown;
        for (;;) {
          const sentAt = performance.now();
          body = (await getJson(url)).body;
          if ((body as Task).completed || sentAt - acked > READ_CACHE_STALE_MS) break;
          await new Promise((r) => setTimeout(r, 20));
        }
        const ms = performance.now() - acked;
        console.log(`a gateway with no notices current ${ms.toFixed(1)} ms after the ack`);
        assert.deepEqual(body, patched.body, `still the old task ${ms.toFixed(0)} ms after the PATCH`);
      } finally {
        await deaf.task.close();
      }
    } finally {
      await nats.close();
    }
  });

  it("task updates - the typed clients send ifMatch and report the revision, over HTTP and NATS", async () => {
    for (const client of [httpClient(taskApi, svc.taskUrl), natsClient(taskApi, svc.handle.nc)]) {
      let revision = 0;
      const task = await client.createTask({ title: "typed" }, { onRevision: (r) => (revision = r) });
      assert.ok(revision > 0);
      const created = revision;
      const done = await client.updateTask(
        { id: task.id, completed: true },
        { ifMatch: created, onRevision: (r) => (revision = r) },
      );
      assert.deepEqual(done, { ...task, completed: true });
      assert.ok(revision > created);
      await assert.rejects(
        client.deleteTask({ id: task.id }, { ifMatch: created }),
        (err) => err instanceof ClientError && err.status === 412 && err.error._tag === "PreconditionFailed",
      );
      assert.equal(await client.deleteTask({ id: task.id }, { ifMatch: revision }), null);
    }
  });
});

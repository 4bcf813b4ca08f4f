// The Task API's writes after creation over real HTTP, NATS and KV: delete.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { lifo } from "./helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "./helpers/service.ts";

type Task = { id: string; title: string; completed: boolean };

describe("task writes", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  const create = async (title: string) => (await postJson(`${svc.taskUrl}/`, { title })).body as Task;
  const request = async (subject: string, body: unknown) => {
    const msg = await svc.handle.nc.request(subject, JSON.stringify(body), { timeout: 5_000 });
    return { code: msg.headers?.get("Nats-Service-Error-Code") ?? "", body: msg.json<unknown>() };
  };

  it("task writes - deleteTask over HTTP deletes, then getTask and a second delete are 404", async () => {
    const task = await create("to delete");
    const deleted = await fetch(`${svc.taskUrl}/${task.id}`, { method: "DELETE" });
    assert.equal(deleted.status, 204);
    assert.equal(await deleted.text(), "");
    const read = await getJson(`${svc.taskUrl}/${task.id}`);
    assert.equal(read.status, 404);
    assert.deepEqual(read.body, { _tag: "TaskNotFound", id: task.id, message: `no task "${task.id}"` });
    const again = await fetch(`${svc.taskUrl}/${task.id}`, { method: "DELETE" });
    assert.equal(again.status, 404);
    assert.equal(((await again.json()) as { _tag: string })._tag, "TaskNotFound");
  });

  it("task writes - deleteTask of an odd id is 404 TaskNotFound", async () => {
    for (const path of ["*", "a.b", "%2F", encodeURIComponent("héllo")]) {
      const res = await fetch(`${svc.taskUrl}/${path}`, { method: "DELETE" });
      assert.equal(res.status, 404, path);
    }
  });

  it("task writes - tasks.delete over NATS answers null, then 404; a missing id is 400", async () => {
    const task = await create("nats delete");
    assert.deepEqual(await request("tasks.delete", { id: task.id }), { code: "", body: null });
    assert.equal((await request("tasks.get", { id: task.id })).code, "404");
    const again = await request("tasks.delete", { id: task.id });
    assert.equal(again.code, "404");
    assert.deepEqual(again.body, { _tag: "TaskNotFound", id: task.id, message: `no task "${task.id}"` });
    const bad = await request("tasks.delete", {});
    assert.equal(bad.code, "400");
    assert.equal((bad.body as { _tag: string })._tag, "HttpApiDecodeError");
  });
});

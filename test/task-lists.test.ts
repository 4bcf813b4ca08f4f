// listTasks and listTasksDO over real HTTP, NATS and KV (pages in creation order, cursors, concurrent creates),
// and the task-object writes (PATCH, DELETE /do/:id?name=) with their errors.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { allPages } from "./helpers/pages.ts";
import { getJson, natsRequest, postJson, startService, type TestService } from "./helpers/service.ts";

type Task = { id: string; title: string; completed: boolean };
type Page = { items: Task[]; cursor?: string };

describe("task lists", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  const request = (subject: string, body: unknown, h: Record<string, string> = {}) =>
    natsRequest(svc, subject, body, h);

  for (const [label, base, create] of [
    ["listTasks", (u: string) => `${u}/?`, (u: string, title: string) => postJson(`${u}/`, { title })],
    [
      "listTasksDO",
      (u: string) => `${u}/do/tasks?name=lists`,
      (u: string, title: string) => postJson(`${u}/do?name=lists`, { title }),
    ],
  ] as const) {
    it(`task lists - ${label} pages cover every task once while creates run`, async () => {
      const ids: string[] = [];
      for (let i = 0; i < 45; i++) ids.push(((await create(svc.taskUrl, `before ${i}`)).body as Task).id);
      const creating = () => Promise.all(Array.from({ length: 30 }, (_, i) => create(svc.taskUrl, `during ${i}`)));
      const { seen, pages } = await allPages<Task>(base(svc.taskUrl), 7, creating);
      const seenIds = seen.map((t) => t.id);
      assert.equal(new Set(seenIds).size, seenIds.length, "a task listed twice");
      for (const id of ids) assert.ok(seenIds.includes(id), `task ${id} missing`);
      assert.ok(pages >= 7, `${pages} pages`);
      const created = new Set(ids);
      assert.deepEqual(
        seenIds.filter((id) => created.has(id)),
        ids,
        "in creation order",
      );
    });
  }

  for (const [label, createPath, itemPath, listPath] of [
    ["listTasks", "/", (id: string) => `/${id}`, "/?limit=1000"],
    ["listTasksDO", "/do?name=updated", (id: string) => `/do/${id}?name=updated`, "/do/tasks?name=updated&limit=1000"],
  ] as const) {
    it(`task lists - ${label} keeps an updated task in its place, drops a deleted one, once each`, async () => {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++)
        ids.push(((await postJson(`${svc.taskUrl}${createPath}`, { title: `u${i}` })).body as Task).id);
      const patch = await fetch(`${svc.taskUrl}${itemPath(ids[0]!)}`, {
        method: "PATCH",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ title: "changed" }),
      });
      assert.equal(patch.status, 200);
      assert.equal((await fetch(`${svc.taskUrl}${itemPath(ids[1]!)}`, { method: "DELETE" })).status, 204);
      const listed = ((await getJson(`${svc.taskUrl}${listPath}`)).body as Page).items.filter((t) =>
        ids.includes(t.id),
      );
      assert.deepEqual(
        listed.map((t) => [t.id, t.title]),
        [
          [ids[0], "changed"],
          [ids[2], "u2"],
        ],
      );
    });
  }

  it("task lists - the last page has no cursor; a bad cursor or limit is 400", async () => {
    await postJson(`${svc.taskUrl}/do?name=short`, { title: "one" });
    const page = (await getJson(`${svc.taskUrl}/do/tasks?name=short`)).body as Page;
    assert.equal(page.items.length, 1);
    assert.equal(page.cursor, undefined);
    const listed = (await getJson(`${svc.taskUrl}/do/tasks?name=lists&limit=1`)).body as Page;
    for (const query of [
      "cursor=***",
      "cursor=bm90LWEta2V5",
      `cursor=${listed.cursor}&name=short`,
      "limit=0",
      "limit=1001",
      "limit=ten",
    ]) {
      const res = await getJson(`${svc.taskUrl}/do/tasks?${query}`);
      assert.equal(res.status, 400, query);
      assert.equal((res.body as { _tag: string })._tag, "HttpApiDecodeError", query);
    }
    // One issue per problem, saying what the field takes.
    assert.deepEqual(((await getJson(`${svc.taskUrl}/?limit=0`)).body as { issues: unknown[] }).issues, [
      { _tag: "Type", path: ["limit"], message: 'Expected an integer from 1 to 1000, actual "0"' },
    ]);
    assert.equal((await getJson(`${svc.taskUrl}/?cursor=${listed.cursor}`)).status, 400);
    await Promise.all([1, 2, 3].map((i) => postJson(`${svc.taskUrl}/`, { title: `plain ${i}` })));
    const nats = await request("tasks.list", { limit: 2 });
    assert.equal((nats.body as Page).items.length, 2);
    assert.equal((await request("tasks.list", { limit: 2000 })).code, "400");
  });

  it("task lists - task-object PATCH and DELETE with ETag, If-Match 412 and 404, over HTTP", async () => {
    const created = await postJson(`${svc.taskUrl}/do?name=writes`, { title: "do it" });
    const task = created.body as Task;
    const etag = created.headers.get("etag")!;
    const url = `${svc.taskUrl}/do/${task.id}?name=writes`;
    const patch = (body: unknown, h: Record<string, string> = {}) =>
      fetch(url, {
        method: "PATCH",
        headers: { "content-type": "application/json", ...h },
        body: JSON.stringify(body),
      });
    const done = await patch({ completed: true }, { "if-match": etag });
    assert.equal(done.status, 200);
    assert.deepEqual(await done.json(), { ...task, completed: true });
    assert.notEqual(done.headers.get("etag"), etag);
    assert.deepEqual((await getJson(url)).body, { ...task, completed: true });
    const stale = await patch({ title: "late" }, { "if-match": etag });
    assert.equal(stale.status, 412);
    assert.equal(((await stale.json()) as { _tag: string })._tag, "PreconditionFailed");
    assert.equal((await patch({})).status, 400);
    assert.equal((await getJson(`${svc.taskUrl}/do/${task.id}?name=elsewhere`)).status, 404);
    assert.equal((await fetch(`${svc.taskUrl}/do/${task.id}?name=elsewhere`, { method: "DELETE" })).status, 404);
    const staleDelete = await fetch(url, { method: "DELETE", headers: { "if-match": etag } });
    assert.equal(staleDelete.status, 412);
    const deleted = await fetch(url, { method: "DELETE", headers: { "if-match": done.headers.get("etag")! } });
    assert.equal(deleted.status, 204);
    assert.equal((await getJson(url)).status, 404);
    assert.equal((await fetch(url, { method: "DELETE" })).status, 404);
  });

  it("task lists - over NATS the subject's name wins over a name in the body", async () => {
    const created = await request(`taskobjects.${nameToken("subject-name")}.create`, { title: "t", name: "body-name" });
    const task = created.body as Task;
    assert.equal(created.code, "", JSON.stringify(created.body));
    assert.equal((await getJson(`${svc.taskUrl}/do/${task.id}?name=subject-name`)).status, 200);
    assert.equal((await getJson(`${svc.taskUrl}/do/${task.id}?name=body-name`)).status, 404);
    const listed = await request(`taskobjects.${nameToken("subject-name")}.list`, { name: "body-name" });
    assert.deepEqual(listed.body, { items: [task] });
  });

  it("task lists - task-object update, delete and list over NATS, from the owner's memory", async () => {
    const token = nameToken("nats-writes");
    const task = (await request(`taskobjects.${token}.create`, { title: "n" })).body as Task;
    const read = await request(`taskobjects.${token}.get`, { id: task.id }); // kept by the owner now
    const updated = await request(
      `taskobjects.${token}.update`,
      { id: task.id, title: "m" },
      { "If-Match": read.revision },
    );
    assert.deepEqual(updated.body, { ...task, title: "m" });
    assert.deepEqual((await request(`taskobjects.${token}.get`, { id: task.id })).body, { ...task, title: "m" });
    const stale = await request(`taskobjects.${token}.delete`, { id: task.id }, { "If-Match": read.revision });
    assert.deepEqual([stale.code, stale.body?._tag], ["412", "PreconditionFailed"]);
    assert.deepEqual((await request(`taskobjects.${token}.list`, {})).body, { items: [{ ...task, title: "m" }] });
    assert.deepEqual((await request(`taskobjects.${token}.delete`, { id: task.id })).body, null);
    assert.equal((await request(`taskobjects.${token}.get`, { id: task.id })).code, "404");
    assert.equal((await request(`taskobjects.${token}.update`, { id: task.id, title: "x" })).code, "404");
    assert.deepEqual((await request(`taskobjects.${token}.list`, {})).body, { items: [] });
    for (const [verb, body] of [
      ["update", { id: task.id }],
      ["update", { id: task.id, completed: "yes" }],
      ["delete", {}],
      ["list", { limit: 0 }],
      ["list", { cursor: "!" }],
    ] as const) {
      const bad = await request(`taskobjects.${token}.${verb}`, body);
      assert.deepEqual([bad.code, bad.body?._tag], ["400", "HttpApiDecodeError"], `${verb} ${JSON.stringify(body)}`);
    }
  });
});

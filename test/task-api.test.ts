// The Task API over real HTTP, NATS and KV: every row of the HTTP contract.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { lifo } from "./helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "./helpers/service.ts";

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe("task api", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { bodyLimit: 64 * 1024 });
  });

  it("task api - createTask answers a new task and getTask reads it back", async () => {
    const created = await postJson(`${svc.taskUrl}/`, { title: "write tests" });
    assert.equal(created.status, 200);
    assert.equal(created.headers.get("content-type"), "application/json");
    const task = created.body as { id: string; title: string; completed: boolean };
    assert.match(task.id, UUID_V4);
    assert.deepEqual(task, { id: task.id, title: "write tests", completed: false });
    const read = await getJson(`${svc.taskUrl}/${task.id}`);
    assert.equal(read.status, 200);
    assert.deepEqual(read.body, task);
  });

  it("task api - getTask of an unknown id is 404 TaskNotFound with that id", async () => {
    const id = "00000000-0000-4000-8000-000000000000";
    const res = await getJson(`${svc.taskUrl}/${id}`);
    assert.equal(res.status, 404);
    assert.equal(res.headers.get("content-type"), "application/json");
    assert.deepEqual(res.body, { _tag: "TaskNotFound", id, message: `no task "${id}"` });
  });

  it("task api - odd ids are 404 TaskNotFound, never 400 or 500", async () => {
    const cases: [string, string][] = [
      ["*", "*"],
      ["a.b", "a.b"],
      ["%2F", "/"],
      ["a%2Fb%2Fc", "a/b/c"],
      [encodeURIComponent("héllo wörld ✓"), "héllo wörld ✓"],
      ["%3E%00", ">\u0000"],
      ["x".repeat(5000), "x".repeat(5000)],
      ["_YS5i", "_YS5i"],
      ["%E0%A4%A", "%E0%A4%A"],
    ];
    for (const [path, id] of cases) {
      const res = await getJson(`${svc.taskUrl}/${path}`);
      assert.equal(res.status, 404, `status for ${path.slice(0, 20)}`);
      assert.deepEqual(
        res.body,
        { _tag: "TaskNotFound", id, message: `no task "${id}"` },
        `body for ${path.slice(0, 20)}`,
      );
    }
  });

  it("task api - a missing title is 400 HttpApiDecodeError with a Missing issue", async () => {
    const res = await postJson(`${svc.taskUrl}/`, {});
    assert.equal(res.status, 400);
    const body = res.body as { _tag: string; issues: unknown[]; message: string };
    assert.equal(body._tag, "HttpApiDecodeError");
    assert.deepEqual(body.issues, [{ _tag: "Missing", path: ["title"], message: "is missing" }]);
    assert.equal(typeof body.message, "string");
  });

  it("task api - a title of the wrong type is 400 with a Type issue", async () => {
    const res = await postJson(`${svc.taskUrl}/`, { title: 42 });
    assert.equal(res.status, 400);
    const body = res.body as { issues: { _tag: string; path: string[] }[] };
    assert.deepEqual(
      body.issues.map((i) => [i._tag, i.path]),
      [["Type", ["title"]]],
    );
  });

  it("task api - invalid JSON, an empty body and a non-object body are 400", async () => {
    for (const raw of ["{nope", "", "   ", "[]", '"title"', "null", "17"]) {
      const res = await postJson(`${svc.taskUrl}/`, raw);
      assert.equal(res.status, 400, `status for ${JSON.stringify(raw)}`);
      assert.equal((res.body as { _tag: string })._tag, "HttpApiDecodeError");
    }
  });

  it("task api - a body without content-type is read as JSON", async () => {
    const res = await fetch(`${svc.taskUrl}/`, { method: "POST", body: '{"title":"bare"}', headers: {} });
    // fetch adds text/plain for string bodies unless told otherwise: send raw bytes instead.
    const raw = await fetch(`${svc.taskUrl}/`, { method: "POST", body: new TextEncoder().encode('{"title":"bare"}') });
    assert.equal(res.status, 415, "text/plain is not JSON");
    assert.equal(raw.status, 200);
    assert.equal(((await raw.json()) as { title: string }).title, "bare");
  });

  it("task api - a non-JSON content type is 415", async () => {
    const res = await postJson(`${svc.taskUrl}/`, "title=x", { "content-type": "application/x-www-form-urlencoded" });
    assert.equal(res.status, 415);
    // The microVM API's 415 has the same words (test/api-keys.test.ts).
    assert.deepEqual(res.body, { _tag: "UnsupportedMediaType", message: "content-type must be application/json" });
  });

  it("task api - a body over the limit is 413 and the service keeps serving", async () => {
    const res = await postJson(`${svc.taskUrl}/`, { title: "x".repeat(70 * 1024) });
    assert.equal(res.status, 413);
    assert.equal((res.body as { _tag: string })._tag, "PayloadTooLarge");
    const ok = await postJson(`${svc.taskUrl}/`, { title: "y".repeat(60 * 1024) });
    assert.equal(ok.status, 200);
  });

  it("task api - unknown routes and methods are 404", async () => {
    for (const [method, path] of [
      ["DELETE", "/"],
      ["PUT", "/"],
      ["GET", "/a/b/c"],
      ["DELETE", "/a/b"],
      ["PATCH", "/"],
    ]) {
      const res = await fetch(`${svc.taskUrl}${path}`, { method });
      assert.equal(res.status, 404, `${method} ${path}`);
      assert.equal(((await res.json()) as { _tag: string })._tag, "RouteNotFound");
    }
  });

  it("task api - every response carries CORS headers, errors included", async () => {
    for (const res of [
      await fetch(`${svc.taskUrl}/missing`),
      await fetch(`${svc.taskUrl}/`, { method: "POST", body: "{" }),
      await fetch(`${svc.taskUrl}/`, {
        method: "POST",
        body: '{"title":"c"}',
        headers: { "content-type": "application/json" },
      }),
    ]) {
      assert.equal(res.headers.get("access-control-allow-origin"), "*");
      assert.equal(res.headers.get("vary"), "Origin");
      await res.arrayBuffer();
    }
  });

  it("task api - any OPTIONS request is a 204 preflight", async () => {
    for (const path of ["/", "/anything", "/do", "/x/y/z"]) {
      const res = await fetch(`${svc.taskUrl}${path}`, { method: "OPTIONS" });
      assert.equal(res.status, 204, path);
      assert.equal(res.headers.get("access-control-allow-origin"), "*");
      assert.equal(res.headers.get("access-control-allow-methods"), "GET, POST, PATCH, DELETE, OPTIONS");
      // Without API keys no Authorization: the original's Content-Type plus the service's headers.
      assert.equal(res.headers.get("access-control-allow-headers"), "Content-Type, Idempotency-Key, X-Request-Id");
    }
  });

  it("task api - 200 concurrent creates have unique ids and matching titles", async () => {
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) => postJson(`${svc.taskUrl}/`, { title: `task ${i}` })),
    );
    const ids = new Set<string>();
    results.forEach((res, i) => {
      assert.equal(res.status, 200);
      const task = res.body as { id: string; title: string };
      assert.equal(task.title, `task ${i}`);
      ids.add(task.id);
    });
    assert.equal(ids.size, 200);
    for (const res of results.slice(0, 20)) {
      const task = res.body as { id: string };
      assert.deepEqual((await getJson(`${svc.taskUrl}/${task.id}`)).body, task);
    }
  });

  it("task api - an Idempotency-Key makes a retried create answer the same task", async () => {
    const key = "7b7a0a5e-2f55-4d38-9a49-5b1f4f0e9c11";
    const first = await postJson(`${svc.taskUrl}/`, { title: "once" }, { "idempotency-key": key });
    const again = await postJson(`${svc.taskUrl}/`, { title: "once" }, { "idempotency-key": key });
    assert.equal(first.status, 200);
    assert.deepEqual(again.body, first.body);
    assert.equal((first.body as { id: string }).id, key);
    const other = await postJson(`${svc.taskUrl}/`, { title: "different" }, { "idempotency-key": key });
    assert.equal(other.status, 409);
    assert.equal((other.body as { _tag: string })._tag, "IdempotencyKeyReused");
    const bad = await postJson(`${svc.taskUrl}/`, { title: "x" }, { "idempotency-key": "not-a-uuid" });
    assert.equal(bad.status, 400);
  });

  it("task api - a miss is never cached: a task created after a 404 is found at once", async () => {
    const id = crypto.randomUUID();
    assert.equal((await getJson(`${svc.taskUrl}/${id}`)).status, 404);
    const created = await postJson(`${svc.taskUrl}/`, { title: "late" }, { "idempotency-key": id });
    assert.equal(created.status, 200);
    assert.deepEqual((await getJson(`${svc.taskUrl}/${id}`)).body, { id, title: "late", completed: false });
    assert.deepEqual((await getJson(`${svc.taskUrl}/${id}`)).body, { id, title: "late", completed: false });
  });

  it("task api - poison keys in the body neither pollute prototypes nor get stored", async () => {
    const res = await postJson(
      `${svc.taskUrl}/`,
      '{"title":"p","__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}',
    );
    assert.equal(res.status, 200);
    assert.deepEqual(Object.keys(res.body as object).sort(), ["completed", "id", "title"]);
    assert.equal(({} as { polluted?: boolean }).polluted, undefined);
  });
});

describe("task objects", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  it("task objects - createTaskDO then getTaskDO round trips in the default object", async () => {
    const created = await postJson(`${svc.taskUrl}/do`, { title: "in default" });
    assert.equal(created.status, 200);
    const task = created.body as { id: string };
    assert.deepEqual((await getJson(`${svc.taskUrl}/do/${task.id}`)).body, task);
    assert.deepEqual((await getJson(`${svc.taskUrl}/do/${task.id}?name=default`)).body, task);
  });

  it("task objects - a missing id is 404 TaskNotFound, not 500", async () => {
    const res = await getJson(`${svc.taskUrl}/do/nothing-here?name=alpha`);
    assert.equal(res.status, 404);
    assert.deepEqual(res.body, { _tag: "TaskNotFound", id: "nothing-here", message: 'no task "nothing-here"' });
  });

  it("task objects - different names have separate storage", async () => {
    const inA = (await postJson(`${svc.taskUrl}/do?name=a`, { title: "a" })).body as { id: string };
    const inB = (await postJson(`${svc.taskUrl}/do?name=${encodeURIComponent("b.ü/*")}`, { title: "b" })).body as {
      id: string;
    };
    assert.equal((await getJson(`${svc.taskUrl}/do/${inA.id}?name=a`)).status, 200);
    assert.equal((await getJson(`${svc.taskUrl}/do/${inA.id}?name=b`)).status, 404);
    assert.equal((await getJson(`${svc.taskUrl}/do/${inA.id}`)).status, 404);
    assert.equal((await getJson(`${svc.taskUrl}/do/${inB.id}?name=${encodeURIComponent("b.ü/*")}`)).status, 200);
    assert.equal((await getJson(`${svc.taskUrl}/${inA.id}`)).status, 404, "object store is separate too");
  });

  it("task objects - a miss is never cached: a task created after a 404 is found at once", async () => {
    const id = crypto.randomUUID();
    assert.equal((await getJson(`${svc.taskUrl}/do/${id}?name=late`)).status, 404);
    const created = await postJson(`${svc.taskUrl}/do?name=late`, { title: "late" }, { "idempotency-key": id });
    assert.equal(created.status, 200);
    assert.deepEqual((await getJson(`${svc.taskUrl}/do/${id}?name=late`)).body, {
      id,
      title: "late",
      completed: false,
    });
    assert.deepEqual((await getJson(`${svc.taskUrl}/do/${id}?name=late`)).body, {
      id,
      title: "late",
      completed: false,
    });
  });

  it("task objects - an empty or overlong name is 400", async () => {
    assert.equal((await getJson(`${svc.taskUrl}/do/x?name=`)).status, 400);
    assert.equal((await postJson(`${svc.taskUrl}/do?name=${"n".repeat(257)}`, { title: "t" })).status, 400);
  });

  it("task objects - 100 parallel createTaskDO → getTaskDO round trips", async () => {
    const names = ["p0", "p1", "p2", "p3"];
    const trips = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const name = names[i % names.length]!;
        const created = await postJson(`${svc.taskUrl}/do?name=${name}`, { title: `t${i}` });
        assert.equal(created.status, 200);
        const task = created.body as { id: string; title: string };
        const read = await getJson(`${svc.taskUrl}/do/${task.id}?name=${name}`);
        assert.deepEqual(read.body, task);
        return task.id;
      }),
    );
    assert.equal(new Set(trips).size, 100);
  });
});

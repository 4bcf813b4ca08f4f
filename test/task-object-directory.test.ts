// listTaskObjects and getTaskObject over real HTTP, NATS and KV: counts after creates and
// deletes, pages while names are created, where a name is active and for how long, 400s and
// 404s, the routes around `/do/objects`, the typed clients, taskctl and API keys.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { hostname } from "node:os";
import { runCli } from "../client/cli.ts";
import { type ClientError, httpClient, natsClient } from "../client/index.ts";
import { newApiKey, parseApiKeys } from "../gateway/index.ts";
import { recordStores } from "../platform/index.ts";
import { nameToken, taskApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { allPages } from "./helpers/pages.ts";
import { getJson, natsRequest, postJson, startService, type TestService } from "./helpers/service.ts";

type Info = { name: string; tasks: number; activeOn?: string; leaseAgeMs?: number };
type Page = { items: Info[]; cursor?: string };

/** The actors release a name this long after its last request. */
const IDLE_MS = 2_500;
/** A release is seen by then: the idle time, the placement's check (every 250 ms), a busy machine. */
const RELEASE_DEADLINE_MS = 2 * IDLE_MS + 2_000;

/** `probe()` until it answers something, failing at the deadline (polled, never a fixed wait). */
async function until<T>(what: string, deadlineMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const found = await probe();
    if (found !== undefined) return found;
    if (Date.now() > end) assert.fail(`${what}: not within ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const defer = lifo(after);

describe("task object directory", () => {
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { placement: { idleMs: IDLE_MS } });
  });

  const objectUrl = (name: string) => `${svc.taskUrl}/do/objects/${encodeURIComponent(name)}`;
  const info = async (name: string) => {
    const res = await getJson(objectUrl(name));
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body as Info;
  };
  const create = async (name: string, title = "t") => {
    const res = await postJson(`${svc.taskUrl}/do?name=${encodeURIComponent(name)}`, { title });
    assert.equal(res.status, 200);
    return res.body as { id: string };
  };
  const remove = async (name: string, id: string) =>
    (await fetch(`${svc.taskUrl}/do/${id}?name=${encodeURIComponent(name)}`, { method: "DELETE" })).status;

  it("task object directory - getTaskObject counts a name's tasks after creates and deletes, over HTTP and NATS", async () => {
    const name = "count-a";
    const tasks = await Promise.all([1, 2, 3].map((i) => create(name, `t${i}`)));
    const three = await info(name);
    assert.equal(three.name, name);
    assert.equal(three.tasks, 3);
    assert.equal(typeof three.activeOn, "string");
    assert.ok(Number.isInteger(three.leaseAgeMs) && three.leaseAgeMs! >= 0, JSON.stringify(three));
    assert.equal(await remove(name, tasks[0]!.id), 204);
    assert.equal((await info(name)).tasks, 2);
    await create(name, "t4");
    const patched = await fetch(`${svc.taskUrl}/do/${tasks[1]!.id}?name=${name}`, {
      method: "PATCH",
      headers: { "content-type": "application/json" },
      body: '{"completed":true}',
    });
    assert.equal(patched.status, 200);
    const overNats = await natsRequest(svc, `taskobjects.${nameToken(name)}.info`, {});
    assert.equal(overNats.code, "");
    assert.deepEqual({ ...overNats.body, leaseAgeMs: 0 }, { name, tasks: 3, activeOn: three.activeOn, leaseAgeMs: 0 });
    // Every task deleted: the name is still active (the deletes ran there), so it is found.
    for (const task of tasks.slice(1)) assert.equal(await remove(name, task.id), 204);
    const rest = (await natsRequest(svc, `taskobjects.${nameToken(name)}.info`, {})).body as Info;
    assert.equal(rest.tasks, 1);
  });

  it("task object directory - a name with no tasks and no activation is 404 TaskObjectNotFound, odd names included", async () => {
    for (const name of ["never-used", "a/b", "a.b", "*", "ünï cödé", " "]) {
      const res = await getJson(objectUrl(name));
      assert.equal(res.status, 404, name);
      assert.deepEqual(res.body, {
        _tag: "TaskObjectNotFound",
        name,
        message: `no task object "${name}": it has no tasks and no activation`,
      });
      const overNats = await natsRequest(svc, `taskobjects.${nameToken(name)}.info`, {});
      assert.deepEqual([overNats.code, overNats.body?._tag, overNats.body?.name], ["404", "TaskObjectNotFound", name]);
    }
    const odd = "team/a.b *ü";
    await create(odd);
    assert.equal((await info(odd)).name, odd);
    assert.equal((await info(odd)).tasks, 1);
  });

  it("task object directory - pages cover every name once, in order of first activation, while new names are created", async () => {
    const names = Array.from({ length: 23 }, (_, i) => `page-${String(i).padStart(2, "0")}`);
    for (const name of names) await create(name, name);
    const creating = () => Promise.all(Array.from({ length: 12 }, (_, i) => create(`during-${i}`)));
    const { seen, pages } = await allPages<Info>(`${svc.taskUrl}/do/objects?`, 4, creating);
    const seenNames = seen.map((o) => o.name);
    assert.equal(new Set(seenNames).size, seenNames.length, "a name listed twice");
    for (const name of names) {
      const found = seen.find((o) => o.name === name);
      assert.equal(found?.tasks, 1, `${name}: ${JSON.stringify(found)}`);
    }
    assert.ok(pages >= 6, `${pages} pages`);
    const listed = new Set(names);
    assert.deepEqual(
      seenNames.filter((name) => listed.has(name)),
      names,
      "in order of first activation",
    );
    // Over NATS, the same pages.
    const first = (await natsRequest(svc, "taskobjects.list", { limit: 2 })).body as Page;
    assert.equal(first.items.length, 2);
    assert.ok(first.cursor);
    const second = (await natsRequest(svc, "taskobjects.list", { limit: 2, cursor: first.cursor })).body as Page;
    assert.equal(second.items.length, 2);
    const firstNames = first.items.map((o) => o.name);
    assert.ok(
      second.items.every((o) => !firstNames.includes(o.name)),
      "the second page goes on from the first",
    );
    const whole = (await getJson(`${svc.taskUrl}/do/objects?limit=1000`)).body as Page;
    assert.equal(whole.cursor, undefined, "no cursor on the last page");
  });

  it("task object directory - activeOn and leaseAgeMs while a name is active, gone once it is released", async () => {
    const name = "idle-watch";
    const task = await create(name);
    const first = await info(name);
    assert.match(first.activeOn ?? "", new RegExp(`^${hostname()}-${process.pid}-[0-9a-f]{8}$`));
    // The age counts from the claim, not from the last renewal (every TTL/3, ~667 ms); reading
    // the directory is no request to the object, so the name stays idle meanwhile.
    const older = await until("a lease age past the renewal period", IDLE_MS, async () => {
      const now = await info(name);
      return now.leaseAgeMs! > 1_000 ? now : undefined;
    });
    assert.equal(older.activeOn, first.activeOn);
    const idle = await until("the release", RELEASE_DEADLINE_MS, async () => {
      const now = await info(name);
      return now.activeOn === undefined ? now : undefined;
    });
    assert.deepEqual(idle, { name, tasks: 1 }, "no activeOn nor leaseAgeMs once released");
    const listed = ((await getJson(`${svc.taskUrl}/do/objects?limit=1000`)).body as Page).items;
    assert.deepEqual(
      listed.find((o) => o.name === name),
      { name, tasks: 1 },
    );
    // A delete activates it again: found with no task while active, then not at all.
    assert.equal(await remove(name, task.id), 204);
    const emptied = await info(name);
    assert.equal(emptied.tasks, 0);
    assert.equal(typeof emptied.activeOn, "string");
    await until("404 once released with no task", RELEASE_DEADLINE_MS, async () =>
      (await getJson(objectUrl(name))).status === 404 ? true : undefined,
    );
    const relisted = ((await getJson(`${svc.taskUrl}/do/objects?limit=1000`)).body as Page).items;
    assert.equal(
      relisted.find((o) => o.name === name),
      undefined,
    );
  });

  it("task object directory - a lease its holder stopped renewing is no activation once its TTL has passed", async () => {
    const name = "ghost";
    const { taskObjectLeases } = recordStores(svc.handle.requester);
    const lease = { owner: "elsewhere-1-0000abcd", ttlMs: 1_000, since: Date.now() };
    assert.equal(typeof (await taskObjectLeases.put(nameToken(name), JSON.stringify(lease), 0)), "number");
    const held = await info(name);
    assert.deepEqual({ ...held, leaseAgeMs: 0 }, { name, tasks: 0, activeOn: lease.owner, leaseAgeMs: 0 });
    // TTL plus the claimers' margin (0.5 s) after the last write, by the server's clock.
    await until("the lapse", 5_000, async () => ((await getJson(objectUrl(name))).status === 404 ? true : undefined));
  });

  it("task object directory - bad limits, cursors and names are 400 HttpApiDecodeError, over HTTP and NATS", async () => {
    await create("bad-input");
    const other = (await getJson(`${svc.taskUrl}/do/tasks?name=count-a&limit=1`)).body as Page;
    const queries = [
      "limit=0",
      "limit=1001",
      "limit=ten",
      "cursor=***",
      "cursor=bm90LWEta2V5",
      `cursor=${other.cursor}`,
    ];
    for (const query of queries) {
      const res = await getJson(`${svc.taskUrl}/do/objects?${query}`);
      assert.equal(res.status, 400, query);
      assert.equal((res.body as { _tag: string })._tag, "HttpApiDecodeError", query);
    }
    const long = "x".repeat(257);
    const tooLong = await getJson(objectUrl(long));
    assert.deepEqual([tooLong.status, (tooLong.body as { _tag: string })._tag], [400, "HttpApiDecodeError"]);
    assert.equal((await getJson(objectUrl("x".repeat(256)))).status, 404);
    for (const [subject, body] of [
      ["taskobjects.list", { limit: 0 }],
      ["taskobjects.list", { limit: 2000 }],
      ["taskobjects.list", { cursor: "!" }],
      [`taskobjects.${nameToken(long)}.info`, {}],
      ["taskobjects.a.info", {}], // not a canonical name token
    ] as const) {
      const bad = await natsRequest(svc, subject, body);
      assert.deepEqual([bad.code, bad.body?._tag], ["400", "HttpApiDecodeError"], `${subject} ${JSON.stringify(body)}`);
    }
    const client = httpClient(taskApi, svc.taskUrl);
    await assert.rejects(client.getTaskObject({ name: "" }), (err: ClientError) => err.status === 400);
  });

  it("task object directory - GET /do/objects is the list, other methods and deeper paths route as before", async () => {
    for (const path of ["/do/objects", "/do/objects/"]) {
      const res = await getJson(`${svc.taskUrl}${path}`);
      assert.equal(res.status, 200, path);
      assert.ok(Array.isArray((res.body as Page).items), path);
    }
    assert.equal(((await getJson(`${svc.taskUrl}/do/objects/count-a/`)).body as Info).name, "count-a");
    // PATCH and DELETE /do/objects are still updateTaskDO and deleteTaskDO of id "objects".
    const patch = await fetch(`${svc.taskUrl}/do/objects`, {
      method: "PATCH",
      headers: { "content-type": "application/json" },
      body: '{"title":"x"}',
    });
    assert.deepEqual([patch.status, ((await patch.json()) as { id: string }).id], [404, "objects"]);
    const del = await fetch(`${svc.taskUrl}/do/objects`, { method: "DELETE" });
    assert.deepEqual([del.status, ((await del.json()) as { _tag: string })._tag], [404, "TaskNotFound"]);
    for (const method of ["PATCH", "DELETE", "POST"]) {
      const res = await fetch(`${svc.taskUrl}/do/objects/count-a`, {
        method,
        headers: { "content-type": "application/json" },
        body: method === "DELETE" ? undefined : "{}",
      });
      assert.deepEqual([res.status, ((await res.json()) as { _tag: string })._tag], [404, "RouteNotFound"], method);
    }
    assert.equal((await getJson(`${svc.taskUrl}/do/tasks?name=count-a`)).status, 200);
  });

  it("task object directory - the typed clients, over HTTP and NATS", async () => {
    await create("typed");
    const overHttp = httpClient(taskApi, svc.taskUrl);
    const overNats = natsClient(taskApi, svc.handle.nc);
    assert.equal((await overHttp.getTaskObject({ name: "typed" })).tasks, 1);
    assert.equal((await overNats.getTaskObject({ name: "typed" })).tasks, 1);
    const page = await overNats.listTaskObjects({ limit: 1 });
    assert.equal(page.items.length, 1);
    assert.ok(
      (await overHttp.listTaskObjects({ cursor: page.cursor })).items.every((o) => o.name !== page.items[0]!.name),
    );
    for (const client of [overHttp, overNats]) {
      await assert.rejects(
        client.getTaskObject({ name: "no-such-object" }),
        (err: ClientError) => err.status === 404 && err.error._tag === "TaskObjectNotFound",
      );
    }
  });

  it("taskctl - objects ls and objects get; an unknown name exits 1, an empty one 2", async () => {
    await create("cli-object");
    const run = async (...args: string[]) => {
      let stdout = "";
      let stderr = "";
      const code = await runCli(args, {
        out: (text) => void (stdout += `${text}\n`),
        err: (text) => void (stderr += `${text}\n`),
        env: { TASK_API_URL: svc.taskUrl },
      });
      return { code, stdout, stderr };
    };
    const got = await run("objects", "get", "cli-object");
    assert.equal(got.code, 0, got.stderr);
    assert.match(got.stdout, /name\s+cli-object\n/);
    assert.match(got.stdout, /tasks\s+1\n/);
    assert.match(got.stdout, /active on\s+\S+-\d+-[0-9a-f]{8}/);
    const listed = await run("objects", "ls", "--limit", "2", "--json");
    assert.equal(listed.code, 0, listed.stderr);
    const page = JSON.parse(listed.stdout) as Page;
    assert.equal(page.items.length, 2);
    const next = await run("objects", "ls", "--cursor", page.cursor!);
    assert.equal(next.code, 0, next.stderr);
    assert.doesNotMatch(next.stdout, new RegExp(`^${page.items[0]!.name}  `, "m"));
    const missing = await run("objects", "get", "no-such-object");
    assert.equal(missing.code, 1);
    assert.equal(
      missing.stderr.trim(),
      'error: no task object named "no-such-object" (it has no tasks and no activation)',
    );
    assert.equal((await run("objects", "get", "")).code, 2);
  });
});

describe("task object directory - API keys", () => {
  const alice = newApiKey("alice");
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { apiKeys: parseApiKeys(`${alice.line}\n`) });
  });

  it("task object directory - without a key both routes are 401; with one they answer", async () => {
    for (const path of ["/do/objects", "/do/objects/nobody"]) {
      const res = await fetch(`${svc.taskUrl}${path}`);
      assert.equal(res.status, 401, path);
      assert.equal(((await res.json()) as { _tag: string })._tag, "Unauthorized");
    }
    const bearer = { authorization: `Bearer ${alice.key}` };
    await postJson(`${svc.taskUrl}/do?name=keyed`, { title: "k" }, bearer);
    const listed = await fetch(`${svc.taskUrl}/do/objects`, { headers: bearer });
    assert.equal(listed.status, 200);
    assert.deepEqual(
      ((await listed.json()) as Page).items.map((o) => [o.name, o.tasks]),
      [["keyed", 1]],
    );
    assert.equal((await fetch(`${svc.taskUrl}/do/objects/keyed`, { headers: bearer })).status, 200);
    assert.equal((await fetch(`${svc.taskUrl}/do/objects/nobody`, { headers: bearer })).status, 404);
  });
});

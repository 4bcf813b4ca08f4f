// Property-based fuzzing of every route and NATS subject: only declared statuses, never a
// 500, no prototype pollution, and data created before is intact. FUZZ_RUNS sets the cases
// per property (npm test: 300; npm run test:faults: 10,000).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { headers } from "@nats-io/transport-node";
import { nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "./helpers/service.ts";

const RUNS = Number(process.env.FUZZ_RUNS ?? 300);
const DECLARED = new Set([200, 204, 400, 404, 409, 413, 415]);

const poison = fc.constantFrom(
  '{"__proto__":{"polluted":1},"title":"p"}',
  '{"constructor":{"prototype":{"polluted":1}},"content":"c"}',
  '{"title":"t","__proto__":null}',
  '{"title":{"__proto__":{"polluted":1}}}',
);
const deep = fc.integer({ min: 100, max: 5_000 }).map((n) => "[".repeat(n) + "]".repeat(n));
const huge = fc.integer({ min: 60_000, max: 200_000 }).map((n) => JSON.stringify({ title: "x".repeat(n) }));
/** Well-formed inputs (any strings), so success paths are fuzzed too, not only refusals. */
const validish = fc
  .oneof(
    fc.record({ title: fc.string({ unit: "binary" }) }),
    fc.record({ content: fc.string({ unit: "binary" }) }),
    fc.record({ id: fc.oneof(fc.uuid(), fc.string({ unit: "binary" })) }),
    fc.record({ jobId: fc.oneof(fc.uuid(), fc.string({ unit: "binary" })) }),
    fc.record({ title: fc.string(), content: fc.string(), extra: fc.jsonValue() }),
  )
  .map((v) => JSON.stringify(v));
const body = fc.oneof(
  { arbitrary: validish, weight: 4 },
  fc.json(),
  fc.jsonValue().map((v) => JSON.stringify({ title: v, content: v })),
  fc.string(),
  fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b).toString("latin1")),
  poison,
  deep,
  huge,
  fc.constant(""),
);
const contentType = fc.oneof(
  { arbitrary: fc.constant("application/json"), weight: 4 },
  fc.constant(undefined),
  fc.constantFrom(
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/vnd.api+json",
    "APPLICATION/JSON; charset=utf-8",
  ),
  fc.stringMatching(/^[a-z]{1,10}\/[a-z+.-]{1,10}$/),
);
const segment = fc.oneof(
  fc.uuid(),
  fc.string({ maxLength: 40 }).map(encodeURIComponent),
  fc.uint8Array({ maxLength: 24 }).map((b) => [...b].map((x) => `%${x.toString(16).padStart(2, "0")}`).join("")),
  fc.constantFrom("*", ">", "a.b", "%2F", "..", "%", "%E0%A4%A", "do", "__proto__", "constructor"),
);
const query = fc.oneof(
  fc.constant(""),
  segment.map((s) => `?name=${s}`),
  segment.map((s) => `?jobId=${s}`),
  fc.tuple(segment, segment).map(([a, b]) => `?jobId=${a}&jobId=${b}&name=${b}`),
  fc.constant("?__proto__[polluted]=1&constructor[prototype][polluted]=1"),
);
const path = fc.oneof(
  fc.constant("/"),
  fc.constant("/do"),
  segment.map((s) => `/${s}`),
  segment.map((s) => `/do/${s}`),
  fc.array(segment, { minLength: 2, maxLength: 4 }).map((s) => `/${s.join("/")}`),
);
/** Mostly absent; else a proper uuid v4, another uuid version, or garbage. */
const idempotencyKey = fc.oneof(
  { arbitrary: fc.constant(undefined), weight: 6 },
  fc.uuid({ version: 4 }),
  fc.uuid(),
  fc.string({ maxLength: 20 }).filter((s) => /^[\x21-\x7e]+$/.test(s)),
);
/** A declared route with fuzzed ids, names and bodies, or anything at all. */
const routed = fc.constantFrom(
  { method: "POST", path: "/" },
  { method: "GET", path: "/" },
  { method: "POST", path: "/do" },
  { method: "GET", path: "/do/" },
);
const request = fc.record({
  api: fc.constantFrom("task" as const, "job" as const),
  method: fc.constantFrom("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"),
  path,
  route: fc.option(routed, { nil: undefined, freq: 3 }),
  wellFormed: fc.boolean(),
  text: fc.string({ unit: "binary", maxLength: 200 }),
  query,
  contentType,
  body,
  idempotencyKey: idempotencyKey,
});

describe("fuzz", () => {
  const defer = lifo(after);
  let svc: TestService;
  let before1: { task: unknown; job: string; taskDO: unknown };

  before(async () => {
    svc = await startService(defer, { bodyLimit: 64 * 1024 });
    const task = (await postJson(`${svc.taskUrl}/`, { title: "kept" })).body;
    const taskDO = (await postJson(`${svc.taskUrl}/do?name=kept`, { title: "kept do" })).body;
    const job = (await postJson(`${svc.jobUrl}/`, { content: "kept job" })).body as string;
    before1 = { task, job, taskDO };
  });

  it("fuzz - HTTP: random requests get only declared statuses, never 500", async () => {
    const seen = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const base = r.api === "task" ? svc.taskUrl : svc.jobUrl;
        if (r.route) {
          // A declared route with ids from the path arbitrary and, half the time, a body of
          // the right shape holding fuzzed strings.
          r.method = r.route.method;
          r.path =
            r.route.path.endsWith("/") && r.route.path !== "/" ? `${r.route.path}${r.path.slice(1)}` : r.route.path;
          if (r.wellFormed) r.body = JSON.stringify(r.api === "job" ? { content: r.text } : { title: r.text });
        }
        const hasBody = r.method !== "GET" && r.method !== "HEAD";
        const h: Record<string, string> = {};
        if (r.contentType) h["content-type"] = r.contentType;
        if (r.idempotencyKey !== undefined && r.idempotencyKey !== "") h["idempotency-key"] = r.idempotencyKey;
        const res = await fetch(`${base}${r.path}${r.query}`, {
          method: r.method,
          headers: h,
          body: hasBody ? Buffer.from(r.body, "utf8") : undefined,
        });
        const text = await res.text();
        seen.set(res.status, (seen.get(res.status) ?? 0) + 1);
        assert.ok(
          DECLARED.has(res.status),
          `status ${res.status} for ${r.method} ${r.path}${r.query}: ${text.slice(0, 200)}`,
        );
        if (res.status >= 400 && r.method !== "HEAD") {
          const error = JSON.parse(text) as { _tag?: unknown };
          assert.equal(typeof error._tag, "string");
          assert.ok(!/at .*\.ts:\d+/.test(text), "no stack in the body");
        }
      }),
      { numRuns: RUNS },
    );
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
    assert.equal((Object.prototype as Record<string, unknown>).polluted, undefined);
    console.log(`# fuzz http: ${JSON.stringify({ cases: RUNS, statuses: Object.fromEntries(seen) })}`);
    assert.ok(seen.size > 3, `a spread of statuses: ${JSON.stringify([...seen])}`);
  });

  it("fuzz - NATS: random bodies and headers on every subject get declared error codes", async () => {
    const codes = new Map<string, number>();
    // Every field any subject takes, with fuzzed strings: right for one subject of each kind.
    const wellFormed = fc
      .record({
        id: fc.string({ unit: "binary" }),
        title: fc.string({ unit: "binary" }),
        jobId: fc.string({ unit: "binary" }),
        content: fc.string({ unit: "binary" }),
      })
      .map((v) => JSON.stringify(v));
    const subjects = [
      "tasks.get",
      "tasks.create",
      "jobs.get",
      "jobs.create",
      `taskobjects.${nameToken("kept")}.get`,
      `taskobjects.${nameToken("f")}.create`,
      "taskobjects.%%%.get",
      "taskobjects.YQ==.create",
    ];
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...subjects),
        fc.oneof(body, fc.uint8Array({ maxLength: 256 }), { arbitrary: wellFormed, weight: 2 }),
        idempotencyKey,
        async (subject, data, key) => {
          const h = headers();
          if (key) h.set("Idempotency-Key", key);
          const payload = typeof data === "string" ? Buffer.from(data) : data;
          const msg = await svc.handle.nc.request(subject, payload, { timeout: 5_000, headers: h });
          const code = msg.headers?.get("Nats-Service-Error-Code") ?? "";
          codes.set(code || "ok", (codes.get(code || "ok") ?? 0) + 1);
          assert.ok(
            ["", "400", "404", "409"].includes(code),
            `code ${code} on ${subject}: ${msg.string().slice(0, 200)}`,
          );
        },
      ),
      { numRuns: RUNS },
    );
    console.log(`# fuzz nats: ${JSON.stringify({ cases: RUNS, codes: Object.fromEntries(codes) })}`);
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
  });

  it("fuzz - data created before the fuzzing is intact", async () => {
    const task = before1.task as { id: string };
    const taskDO = before1.taskDO as { id: string };
    assert.deepEqual((await getJson(`${svc.taskUrl}/${task.id}`)).body, task);
    assert.deepEqual((await getJson(`${svc.taskUrl}/do/${taskDO.id}?name=kept`)).body, taskDO);
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=${before1.job}`)).body, {
      id: before1.job,
      content: "kept job",
    });
  });
});

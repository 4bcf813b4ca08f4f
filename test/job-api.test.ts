// The Job API over real HTTP, NATS and KV, and the job-created notification.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { watchJobs } from "../client/index.ts";
import { lifo } from "./helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "./helpers/service.ts";

describe("job api", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  it("job api - createJob answers the new id as a JSON string and getJob reads the job", async () => {
    const created = await postJson(`${svc.jobUrl}/`, { content: "render video" });
    assert.equal(created.status, 200);
    assert.equal(created.headers.get("content-type"), "application/json");
    const id = created.body as string;
    assert.equal(typeof id, "string");
    assert.match(id, /^[0-9a-f-]{36}$/);
    const read = await getJson(`${svc.jobUrl}/?jobId=${id}`);
    assert.equal(read.status, 200);
    assert.deepEqual(read.body, { id, content: "render video" });
  });

  it("job api - an unknown jobId is 404 JobNotFound with that id", async () => {
    for (const id of ["nope", "a.b", "*", "ü/>", "x".repeat(3000)]) {
      const res = await getJson(`${svc.jobUrl}/?jobId=${encodeURIComponent(id)}`);
      assert.equal(res.status, 404);
      assert.deepEqual(res.body, { _tag: "JobNotFound", id, message: `no job "${id}"` });
    }
  });

  it("job api - a missing jobId is 400 with a Missing issue; a repeated one is a Type issue", async () => {
    const missing = await getJson(`${svc.jobUrl}/`);
    assert.equal(missing.status, 400);
    assert.deepEqual((missing.body as { issues: unknown }).issues, [
      { _tag: "Missing", path: ["jobId"], message: "is missing" },
    ]);
    const twice = await getJson(`${svc.jobUrl}/?jobId=a&jobId=b`);
    assert.equal(twice.status, 400);
    assert.equal((twice.body as { issues: { _tag: string }[] }).issues[0]!._tag, "Type");
  });

  it("job api - bad createJob payloads are 400, other content types 415", async () => {
    assert.equal((await postJson(`${svc.jobUrl}/`, {})).status, 400);
    assert.equal((await postJson(`${svc.jobUrl}/`, { content: null })).status, 400);
    assert.equal((await postJson(`${svc.jobUrl}/`, "not json")).status, 400);
    assert.equal((await postJson(`${svc.jobUrl}/`, "<x/>", { "content-type": "text/xml" })).status, 415);
  });

  it('job api - a stored item lacking id or content answers the requested id and ""', async () => {
    await svc.buckets.jobs.put("legacy-1", JSON.stringify({ content: "from elsewhere" }));
    await svc.buckets.jobs.put("legacy-2", JSON.stringify({ id: "legacy-2" }));
    await svc.buckets.jobs.put("legacy-3", JSON.stringify({}));
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=legacy-1`)).body, {
      id: "legacy-1",
      content: "from elsewhere",
    });
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=legacy-2`)).body, { id: "legacy-2", content: "" });
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=legacy-3`)).body, { id: "legacy-3", content: "" });
  });

  it("job api - a job another service rewrites reads as rewritten (job reads are never cached)", async () => {
    await svc.buckets.jobs.put("rewritten-1", JSON.stringify({ id: "rewritten-1", content: "first" }));
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=rewritten-1`)).body, { id: "rewritten-1", content: "first" });
    await svc.buckets.jobs.put("rewritten-1", JSON.stringify({ id: "rewritten-1", content: "second" }));
    assert.deepEqual((await getJson(`${svc.jobUrl}/?jobId=rewritten-1`)).body, {
      id: "rewritten-1",
      content: "second",
    });
  });

  it("job api - unknown routes are 404 and there is no CORS on the job host", async () => {
    const res = await fetch(`${svc.jobUrl}/x`);
    assert.equal(res.status, 404);
    assert.equal(res.headers.get("access-control-allow-origin"), null);
    await res.arrayBuffer();
  });

  it("job api - every created job is seen by a KV watcher in another connection", { timeout: 30_000 }, async () => {
    const seen: string[] = [];
    let watching!: () => void;
    const ready = new Promise<void>((resolve) => (watching = resolve));
    const watcher = watchJobs(svc.handle.nc, { onWatching: () => watching() });
    const first = watcher.next(); // starts the watch
    const ids: string[] = [];
    await ready;
    for (let i = 0; i < 5; i++) ids.push((await postJson(`${svc.jobUrl}/`, { content: `w${i}` })).body as string);
    const head = await first;
    seen.push(head.value!.id);
    while (seen.length < ids.length) {
      const next = await watcher.next();
      seen.push(next.value!.id);
    }
    await watcher.return(undefined);
    assert.deepEqual(seen, ids);
  });
});

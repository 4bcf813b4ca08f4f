// Request ids (echoed, and carried to the actors in a NATS header) and Prometheus metrics.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createJob, subscriptionSubject, viaGateway } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "./helpers/service.ts";

describe("observability", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  it("observability - a given x-request-id is echoed; otherwise one is made", async () => {
    const given = await fetch(`${svc.taskUrl}/missing`, { headers: { "x-request-id": "trace-abc.123" } });
    assert.equal(given.headers.get("x-request-id"), "trace-abc.123");
    await given.arrayBuffer();
    const made = await postJson(`${svc.taskUrl}/`, { title: "r" });
    assert.match(made.headers.get("x-request-id") ?? "", /^[0-9a-f-]{36}$/);
    const odd = await fetch(`${svc.jobUrl}/?jobId=x`, { headers: { "x-request-id": "has spaces and ünïcode" } });
    assert.match(odd.headers.get("x-request-id") ?? "", /^[0-9a-f-]{36}$/, "an unsafe id is replaced");
    await odd.arrayBuffer();
  });

  it("observability - the request id reaches the actor in the X-Request-Id header", async () => {
    const { startService: start } = await import("./helpers/service.ts");
    const bare = await start(defer, { actors: false });
    const seen: (string | undefined)[] = [];
    // On the subject the gateway sends on: its copy.
    const sub = bare.handle.nc.subscribe(subscriptionSubject(viaGateway(createJob)), {
      callback: (_err, msg) => {
        seen.push(msg.headers?.get("X-Request-Id"));
        msg.respond(JSON.stringify("00000000-0000-4000-8000-000000000001"));
      },
    });
    defer(() => sub.unsubscribe());
    await bare.handle.nc.flush(); // subscribed at the server before the gateway (another connection) sends
    const res = await postJson(`${bare.jobUrl}/`, { content: "c" }, { "x-request-id": "follow-me" });
    assert.equal(res.status, 200);
    assert.deepEqual(seen, ["follow-me"]);
  });

  it("observability - /metrics counts requests per operation and status", async () => {
    await getJson(`${svc.jobUrl}/?jobId=nope`);
    await postJson(`${svc.jobUrl}/`, { content: "m" });
    const res = await fetch(`${svc.jobUrl}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type") ?? "", /text\/plain/);
    const text = await res.text();
    const count = (labels: string) =>
      Number(new RegExp(`http_request_duration_seconds_count\\{${labels}\\} (\\d+)`).exec(text)?.[1] ?? 0);
    assert.ok(count('api="job",operation="getJob",status="404"') >= 1, "getJob 404 counted");
    assert.ok(count('api="job",operation="createJob",status="200"') >= 1, "createJob 200 counted");
    assert.match(text, /actor_handling_seconds_count\{operation="createJob",status="200"\} \d+/);
    assert.match(text, /^nats_connected 1$/m);
    assert.match(text, /process_resident_memory_bytes \d+/);
  });
});

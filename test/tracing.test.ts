// Traces over real HTTP, NATS and KV, exported over OTLP/HTTP to a receiver this test runs:
// a client's `traceparent` is continued through a gateway, the NATS request, the actor that
// received it, the owner hop to the task object's owner and its KV write, with one trace id
// and each span the child of the one before.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { startActors } from "../actors/index.ts";
import { createGateways } from "../gateway/index.ts";
import { connectNats, recordStores, openBuckets, startTracing } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);

/** A span as OTLP/JSON carries it (ids in hex). */
interface ExportedSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
}
const spans: ExportedSpan[] = [];
let stopTracing: () => Promise<void>;
const gatewayUrls: string[] = [];

before(async () => {
  // The OTLP/HTTP receiver: what the exporter posts to `<endpoint>/v1/traces`, as JSON.
  const receiver = createServer(async (req, res) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    if (req.url === "/v1/traces") {
      const payload = JSON.parse(body) as {
        resourceSpans: { scopeSpans: { spans: ExportedSpan[] }[] }[];
      };
      for (const resource of payload.resourceSpans) for (const scope of resource.scopeSpans) spans.push(...scope.spans);
    }
    res.writeHead(200, { "content-type": "application/json" }).end("{}");
  });
  receiver.listen(0, "127.0.0.1");
  await once(receiver, "listening");
  defer(() => new Promise((done) => receiver.close(done)));
  const endpoint = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  // Before any store is made: stores made while tracing is on record their calls.
  const stop = await startTracing("tracing-test", { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint });
  assert.ok(stop, "tracing starts with an endpoint");
  stopTracing = stop;

  const nats = await testNats(defer);
  const admin = await connectNats({ ...nats.login("admin"), name: "test" });
  defer(() => admin.close());
  await openBuckets(admin.nc);
  // Two actor processes' worth: a request on the shared subject lands on either, and the one
  // that does not own the name passes it on to the one that does.
  for (const name of ["x", "y"]) {
    const handle = await connectNats({ ...nats.login("actors"), name: `test:actors-${name}` });
    defer(() => handle.close());
    const actors = startActors(handle.nc, recordStores(handle.requester), {
      publisher: handle.publisher,
      requester: handle.requester,
      placement: { ownerId: `owner-${name}` },
    });
    defer(() => actors.close());
    await handle.nc.flush();
  }
  // Two gateways without owner routing: their requests take the shared subject.
  for (const name of ["a", "b"]) {
    const handle = await connectNats({ ...nats.login("gateway"), name: `test:gateway-${name}` });
    defer(() => handle.close());
    const task = createGateways({ nats: handle }).task;
    gatewayUrls.push(`http://127.0.0.1:${await task.listen(0, "127.0.0.1")}`);
    defer(() => task.close());
  }
});

const hex = (bytes: number) =>
  Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, "0")).join("");

describe("tracing", () => {
  it("tracing - a client's traceparent goes through a gateway, NATS, the owner hop and the KV write: one trace, each span the child of the one before", async () => {
    const name = `traced-${hex(4)}`;
    // The first create activates the name on whichever process received it: the owner.
    const first = await fetch(`${gatewayUrls[0]}/do?name=${name}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ title: "first" }),
    });
    assert.equal(first.status, 200);
    // Each create is a trace of its own; about half land on the other process and hop.
    const traces: { traceId: string; clientSpan: string }[] = [];
    for (let i = 0; i < 24; i++) {
      const traceId = hex(16);
      const clientSpan = hex(8);
      const res = await fetch(`${gatewayUrls[i % 2]}/do?name=${name}`, {
        method: "POST",
        headers: { "content-type": "application/json", traceparent: `00-${traceId}-${clientSpan}-01` },
        body: JSON.stringify({ title: `traced ${i}` }),
      });
      assert.equal(res.status, 200);
      traces.push({ traceId, clientSpan });
    }
    await stopTracing(); // flushes every span to the receiver
    const byTrace = (traceId: string) => spans.filter((s) => s.traceId === traceId);
    for (const { traceId } of traces) assert.ok(byTrace(traceId).length >= 4, `trace ${traceId} was exported`);
    const hopped = traces.find(({ traceId }) => byTrace(traceId).some((s) => s.name === "forward createTaskDO"));
    assert.ok(
      hopped,
      `no create of 24 went through the owner hop: ${JSON.stringify(spans.map((s) => s.name).slice(0, 20))}`,
    );
    const trace = byTrace(hopped.traceId);
    const one = (label: string, match: (s: ExportedSpan) => boolean) => {
      const found = trace.filter(match);
      assert.equal(found.length, 1, `${label}: ${JSON.stringify(trace.map((s) => s.name))}`);
      return found[0]!;
    };
    const server = one("gateway", (s) => s.name === "POST /do");
    const request = one("NATS request", (s) => s.name.startsWith("request ") && s.parentSpanId === server.spanId);
    const handles = trace.filter((s) => s.name === "handle createTaskDO");
    assert.equal(handles.length, 2, "the receiving process's handler and the owner's");
    const receiving = one(
      "receiving handler",
      (s) => s.name === "handle createTaskDO" && s.parentSpanId === request.spanId,
    );
    const hop = one("owner hop", (s) => s.name === "forward createTaskDO");
    const owning = one("owner's handler", (s) => s.name === "handle createTaskDO" && s.parentSpanId === hop.spanId);
    // A create without a caller's key carries its lease's fence (Placement.carryingFence).
    const write = one("KV write", (s) => s.name === "kv taskobjects createFenced");
    assert.equal(server.parentSpanId, hopped.clientSpan, "the gateway continues the client's span");
    assert.equal(hop.parentSpanId, receiving.spanId, "the hop comes from the receiving handler");
    assert.equal(write.parentSpanId, owning.spanId, "the owner writes the record");
  });
});

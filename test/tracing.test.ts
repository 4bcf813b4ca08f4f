// Traces over real HTTP, NATS and KV, exported over OTLP/HTTP to a receiver this test runs:
// a client's `traceparent` is continued through a gateway, the NATS request, the actor that
// received it, the owner hop to the task object's owner and its KV write, with one trace id
// and each span the child of the one before; background work (lease renewals, idle releases)
// exports nothing; the sampler is the one OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG name.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { startActors, type ActivationEvent } from "../actors/index.ts";
import { createGateways } from "../gateway/index.ts";
import { connectNats, log, recordStores, provisionBuckets, startTracing } from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
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
const received: ExportedSpan[] = [];
const gatewayUrls: string[] = [];
/** Lease keys written (claims, renewals, fences), in order, and task-object activations. */
const leaseWrites: string[] = [];
const activations: ActivationEvent[] = [];
// Renewal period a third of the TTL (the default 2 s); a name idle this long is released.
const IDLE_MS = 3_000;

/** Called on every lease write and activation event: the waits below check their condition. */
let changed = () => {};
/** Resolves once `condition` holds, checked on each lease write or activation event. */
function until(condition: () => boolean, what: string, timeoutMs = 60_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs} ms`)), timeoutMs);
    const check = () => {
      if (!condition()) return;
      clearTimeout(timer);
      changed = () => {};
      resolve();
    };
    changed = check;
    check();
  });
}

const SAMPLER_VARIABLES = ["OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"];
let stopTracing: (() => Promise<void>) | undefined;

/**
 * Starts tracing with these sampler variables (the SDK reads them from the process's
 * environment), the receiver emptied first.
 */
async function startSession(sampler: Record<string, string> = {}): Promise<void> {
  await endSession(); // a test that failed left its own running: its spans go nowhere
  Object.assign(process.env, sampler);
  received.length = 0;
  stopTracing = await startTracing("tracing-test");
  assert.ok(stopTracing, "tracing starts with an endpoint");
}

/** Stops tracing, which flushes every span recorded to the receiver, and gives what arrived. */
async function endSession(): Promise<ExportedSpan[]> {
  await stopTracing?.();
  stopTracing = undefined;
  for (const name of SAMPLER_VARIABLES) delete process.env[name];
  return [...received];
}

before(async () => {
  // The OTLP/HTTP receiver: what the exporter posts to `<endpoint>/v1/traces`, as JSON.
  const receiver = createServer(async (req, res) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    if (req.url === "/v1/traces") {
      const payload = JSON.parse(body) as {
        resourceSpans: { scopeSpans: { spans: ExportedSpan[] }[] }[];
      };
      for (const resource of payload.resourceSpans)
        for (const scope of resource.scopeSpans) received.push(...scope.spans);
    }
    res.writeHead(200, { "content-type": "application/json" }).end("{}");
  });
  receiver.listen(0, "127.0.0.1");
  await once(receiver, "listening");
  defer(() => new Promise((done) => receiver.close(done)));
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  // Before any store is made: stores made while tracing is on record their calls.
  await startSession();
  defer(() => endSession());

  const nats = await testNats(defer);
  const admin = await connectNats({ ...nats.login("admin"), name: "test" });
  defer(() => admin.close());
  await provisionBuckets(admin.nc);
  // Two actor processes' worth: a request on the shared subject lands on either, and the one
  // that does not own the name passes it on to the one that does.
  for (const name of ["x", "y"]) {
    const handle = await connectNats({ ...nats.login("actors"), name: `test:actors-${name}` });
    defer(() => handle.close());
    const stores = recordStores(handle.requester);
    const leases = stores.taskObjectLeases;
    const actors = startActors(
      handle.nc,
      {
        ...stores,
        // The stores as made (traced), each lease write seen on its way.
        taskObjectLeases: {
          ...leases,
          put: (key, value, revision) => {
            leaseWrites.push(key);
            changed();
            return leases.put(key, value, revision);
          },
        },
      },
      {
        publisher: handle.publisher,
        requester: handle.requester,
        placement: {
          ownerId: `owner-${name}`,
          idleMs: IDLE_MS,
          onActivation: (event) => {
            activations.push(event);
            changed();
          },
        },
      },
    );
    defer(() => actors.close());
    await handle.nc.flush();
  }
  // Two gateways without owner routing: their requests take the shared subject.
  for (const name of ["a", "b"]) {
    const handle = await connectNats({ ...nats.login("gateway"), name: `test:gateway-${name}` });
    defer(() => handle.close());
    // The time an actor's answer may take, more than what a busy machine needs, so that a
    // slow request fails no test here (none is about timeouts).
    const task = createGateways({ nats: handle, requestTimeoutMs: 30_000 }).task;
    gatewayUrls.push(`http://127.0.0.1:${await task.listen(0, "127.0.0.1")}`);
    defer(() => task.close());
  }
  await endSession();
});

const hex = (bytes: number) =>
  Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, "0")).join("");

/** A create through gateway `gateway` (`path`: `/` or `/do?name=…`), with `traceparent` if given. */
async function create(gateway: number, path: string, title: string, traceparent?: string): Promise<void> {
  const res = await fetch(`${gatewayUrls[gateway % gatewayUrls.length]}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(traceparent ? { traceparent } : {}) },
    body: JSON.stringify({ title }),
  });
  const body = await res.text();
  assert.equal(res.status, 200, body);
}

/** A client's trace context: a new trace id, and its span, `sampled` or not. */
function clientContext(sampled: boolean) {
  const traceId = hex(16);
  const clientSpan = hex(8);
  return { traceId, clientSpan, traceparent: `00-${traceId}-${clientSpan}-${sampled ? "01" : "00"}` };
}

/**
 * The interval of counts `k` of `Binomial(n, p)` outside which each tail has probability below
 * `alpha / 2`: a correct sampler's count falls outside it once in `1 / alpha` runs.
 */
function binomialBounds(n: number, p: number, alpha: number): [number, number] {
  const logFactorial = [0];
  for (let k = 1; k <= n; k++) logFactorial.push(logFactorial[k - 1]! + Math.log(k));
  const pmf = (k: number) =>
    Math.exp(logFactorial[n]! - logFactorial[k]! - logFactorial[n - k]! + k * Math.log(p) + (n - k) * Math.log(1 - p));
  let low = 0;
  for (let tail = pmf(0); tail < alpha / 2; tail += pmf(++low));
  let high = n;
  for (let tail = pmf(n); tail < alpha / 2; tail += pmf(--high));
  return [low, high];
}

describe("tracing", () => {
  it("tracing - a client's traceparent goes through a gateway, NATS, the owner hop and the KV write: one trace, each span the child of the one before", async () => {
    await startSession();
    const name = `traced-${hex(4)}`;
    // The first create activates the name on whichever process received it: the owner.
    await create(0, `/do?name=${name}`, "first");
    // Each create is a trace of its own; about half land on the other process and hop.
    const traces: { traceId: string; clientSpan: string }[] = [];
    for (let i = 0; i < 24; i++) {
      const context = clientContext(true);
      await create(i, `/do?name=${name}`, `traced ${i}`, context.traceparent);
      traces.push(context);
    }
    const spans = await endSession();
    const byTrace = (traceId: string) => spans.filter((s) => s.traceId === traceId);
    for (const { traceId } of traces) assert.ok(byTrace(traceId).length >= 4, `trace ${traceId} was exported`);
    const count = (traceId: string, name: string) => byTrace(traceId).filter((s) => s.name === name).length;
    // One that hopped once (on a busy machine an attempt that timed out is sent again).
    const hopped = traces.find(({ traceId }) => count(traceId, "forward createTaskDO") === 1);
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

  it("tracing - background work exports nothing: through lease renewals and an idle release only the request's own trace arrives", async () => {
    await startSession(); // the default sampler
    const name = `idle-${hex(4)}`;
    const key = nameToken(name);
    // No traceparent: the trace starts at the gateway. The create activates the name.
    await create(0, `/do?name=${name}`, "then idle");
    const writesBefore = leaseWrites.filter((k) => k === key).length;
    // Idle: the owner renews the name's lease every third of its TTL until it releases it.
    await until(
      () =>
        leaseWrites.filter((k) => k === key).length >= writesBefore + 3 &&
        activations.some((a) => a.name === name && a.event === "end" && a.reason === "released"),
      `three renewals of ${name}'s lease, then its release`,
    );
    const spans = await endSession();
    const roots = spans.filter((s) => !s.parentSpanId);
    assert.deepEqual(
      roots.map((s) => s.name),
      ["POST /do"],
      `one root, the request's: ${JSON.stringify(spans.map((s) => [s.name, s.parentSpanId ?? "root"]))}`,
    );
    const [root] = roots;
    assert.deepEqual(
      spans.filter((s) => s.traceId !== root!.traceId).map((s) => s.name),
      [],
      "every span is of the request's trace",
    );
    const names = new Set(spans.map((s) => s.name));
    for (const step of ["handle createTaskDO", "lease put", "kv taskobjects createFenced"])
      assert.ok(names.has(step), `the request's tree has "${step}": ${JSON.stringify([...names])}`);
  });

  it("tracing - OTEL_TRACES_SAMPLER=always_off: nothing is exported, a sampled traceparent's request included", async () => {
    await startSession({ OTEL_TRACES_SAMPLER: "always_off" });
    const name = `off-${hex(4)}`;
    for (let i = 0; i < 6; i++) {
      await create(i, `/do?name=${name}`, `off ${i}`, i % 2 === 0 ? clientContext(true).traceparent : undefined);
      await create(i, "/", `off ${i}`);
    }
    const key = nameToken(name);
    const writes = leaseWrites.filter((k) => k === key).length;
    await until(() => leaseWrites.filter((k) => k === key).length > writes, `a renewal of ${name}'s lease`);
    assert.deepEqual(
      (await endSession()).map((s) => s.name),
      [],
    );
  });

  it("tracing - OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG=0.5: the fraction of requests exported is binomial, each trace whole", async () => {
    await startSession({ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "0.5" });
    const requests = 300;
    const inFlight = 10;
    let next = 0;
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        for (let i = next++; i < requests; i = next++) await create(i, "/", `ratio ${i}`);
      }),
    );
    const spans = await endSession();
    const roots = spans.filter((s) => !s.parentSpanId);
    assert.deepEqual([...new Set(roots.map((s) => s.name))], ["POST /"], "only the requests start traces");
    // A correct sampler lands outside these once in a million runs.
    const [low, high] = binomialBounds(requests, 0.5, 1e-6);
    assert.ok(
      roots.length >= low && roots.length <= high,
      `${roots.length} of ${requests} requests exported, expected ${low}-${high}`,
    );
    // The decision is the trace id's, so every process makes the same one: no trace is partial.
    const handled = new Set(spans.filter((s) => s.name === "handle createTask").map((s) => s.traceId));
    assert.deepEqual(new Set(roots.map((s) => s.traceId)), handled, "each exported request has its handler's span");
  });

  for (const sampler of ["parentbased_always_on", "parentbased_traceidratio"]) {
    it(`tracing - OTEL_TRACES_SAMPLER=${sampler}: a request whose traceparent says not sampled exports nothing, through the owner hop too`, async () => {
      await startSession({ OTEL_TRACES_SAMPLER: sampler, OTEL_TRACES_SAMPLER_ARG: "1" });
      const name = `unsampled-${hex(4)}`;
      await create(0, `/do?name=${name}`, "first");
      const unsampled: string[] = [];
      const sampled: string[] = [];
      for (let i = 0; i < 12; i++) {
        const context = clientContext(i % 4 === 3);
        (i % 4 === 3 ? sampled : unsampled).push(context.traceId);
        await create(i, `/do?name=${name}`, `${sampler} ${i}`, context.traceparent);
      }
      const spans = await endSession();
      const leaked = spans.filter((s) => unsampled.includes(s.traceId));
      assert.deepEqual(
        leaked.map((s) => s.name),
        [],
        "nothing of the unsampled requests",
      );
      for (const traceId of sampled)
        assert.ok(spans.filter((s) => s.traceId === traceId).length >= 4, `sampled trace ${traceId} was exported`);
    });
  }

  it("tracing - an OTEL_TRACES_SAMPLER value the SDK does not know is logged at start as a warning", async (t) => {
    const warn = t.mock.method(log, "warn");
    await startSession({ OTEL_TRACES_SAMPLER: "sometimes" });
    await endSession();
    const said = warn.mock.calls.map((call) => JSON.stringify(call.arguments));
    assert.ok(
      said.some((line) => line.includes("OTEL_TRACES_SAMPLER") && line.includes("sometimes")),
      `a warning naming the variable: ${JSON.stringify(said)}`,
    );
  });
});

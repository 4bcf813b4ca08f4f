// The per-request histogram (platform/histogram.ts) must expose exactly what prom-client's own
// Histogram exposes for the same observations: a scrape cannot tell them apart.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Histogram, Registry } from "prom-client";
import { LabeledHistogram } from "../platform/histogram.ts";

const bounds = [0.0005, 0.001, 0.01, 0.5, 1, 5];
const observations: [op: string, status: number, seconds: number][] = [
  ["getTask", 200, 0.0001],
  ["getTask", 200, 0.0005], // on a bound: counted in it
  ["getTask", 200, 0.00051],
  ["getTask", 404, 0.3],
  ["createTask", 201, 7], // above every bound: only in +Inf
  ["createTask", 201, 0],
  ["getTask", 200, 1],
  ["createTask", 500, 0.01],
];

function both() {
  const ours = new Registry();
  const theirs = new Registry();
  const histogram = new LabeledHistogram<"operation" | "status">("req_seconds", "Requests", bounds, ours);
  const reference = new Histogram({
    name: "req_seconds",
    help: "Requests",
    labelNames: ["operation", "status"] as const,
    buckets: bounds,
    registers: [theirs],
  });
  for (const [operation, status, seconds] of observations) {
    histogram.observe(`${operation} ${status}`, () => ({ operation, status: String(status) }), seconds);
    reference.observe({ operation, status: String(status) }, seconds);
  }
  return { ours, theirs, histogram };
}

describe("histogram", () => {
  it("histogram - the exposition text is prom-client's, series by series", async () => {
    const { ours, theirs } = both();
    const text = await ours.metrics();
    assert.equal(text, await theirs.metrics());
    assert.match(text, /req_seconds_bucket\{le="0.0005",operation="getTask",status="200"\} 2\n/);
    assert.match(text, /req_seconds_bucket\{le="\+Inf",operation="createTask",status="201"\} 2\n/);
    assert.match(text, /req_seconds_count\{operation="getTask",status="200"\} 4\n/);
  });

  it("histogram - the JSON form and a reset match prom-client's too", async () => {
    const { ours, theirs, histogram } = both();
    // Exemplars (none here, and none in the service) aside.
    const plain = (json: unknown) => JSON.parse(JSON.stringify(json, (k, v) => (k === "exemplar" ? undefined : v)));
    assert.deepEqual(plain(await ours.getMetricsAsJSON()), plain(await theirs.getMetricsAsJSON()));
    histogram.reset();
    ours.resetMetrics();
    theirs.resetMetrics();
    assert.equal(await ours.metrics(), await theirs.metrics());
  });
});

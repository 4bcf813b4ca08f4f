// Prometheus metrics (prom-client) for the process: HTTP requests per operation and status,
// actor handling time, NATS connectivity, microVM instances per state, and Node's defaults.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import { LabeledHistogram } from "./histogram.ts";

export const registry = new Registry();
collectDefaultMetrics({ register: registry });

const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

const httpRequests = new LabeledHistogram<"api" | "operation" | "status">(
  "http_request_duration_seconds",
  "HTTP requests by API, operation and status: count and latency",
  latencyBuckets,
  registry,
);

const actorHandling = new LabeledHistogram<"operation" | "status">(
  "actor_handling_seconds",
  "Time actors spend on a NATS request, by operation and outcome status",
  latencyBuckets,
  registry,
);

/** Set by the connection's status watcher: 1 connected, 0 not. */
export const natsConnected = new Gauge({
  name: "nats_connected",
  help: "1 while the NATS connection is up",
  registers: [registry],
});

/** Reconnects since start. */
export const natsReconnects = new Counter({
  name: "nats_reconnects_total",
  help: "NATS reconnections since the process started",
  registers: [registry],
});

/** Filled at scrape time by the microVM host, when this process runs one. */
export const microvmInstances = new Gauge({
  name: "microvm_instances",
  help: "MicroVM instances of this host by state",
  labelNames: ["state"] as const,
  registers: [registry],
});

/** Filled at scrape time by the microVM host, when its provider boots walls (sandbox, gVisor). */
/** Objects active on this microVM host (each running its instance), and calls refused as busy. */
export const microvmObjectsActive = new Gauge({
  name: "microvm_objects_active",
  help: "Objects whose activation runs on this microVM host",
  registers: [registry],
});
export const microvmObjectsBusy = new Counter({
  name: "microvm_objects_busy_total",
  help: "Object calls refused with 429 ObjectBusy (more calls waiting than one object takes)",
  registers: [registry],
});

export const microvmBoots = new Gauge({
  name: "microvm_boots",
  help: "Walls of this host booting now (running), launches waiting for a boot slot (waiting) and walls booted ahead whose runtime is up, waiting for a launch (ready)",
  labelNames: ["state"] as const,
  registers: [registry],
});

/** Filled at scrape time by the microVM host: long polls of instance logs waiting for a line. */
export const microvmLogWaits = new Gauge({
  name: "microvm_log_waits",
  help: "Reads of instance logs waiting for a new line on this host (each holds a NATS subscription)",
  registers: [registry],
});

const taskObjectActivations = new Gauge({
  name: "task_object_activations",
  help: "Task-object names whose lease this process holds",
  registers: [registry],
});

const taskObjectForwards = new Counter({
  name: "task_object_forwards_total",
  help: "Task-object requests passed to the owning process, by outcome",
  labelNames: ["outcome"] as const,
  registers: [registry],
});

/**
 * Requests already waiting or running for a task object's name as one more arrives at its
 * owner: a histogram, so its labels stay bounded however many names there are.
 */
const queueDepth = new Histogram({
  name: "task_object_queue_depth",
  help: "Requests already waiting or running for the same task object when one arrives at its owner",
  buckets: [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
  registers: [registry],
});

/** Records the depth a request found its name's queue at; one refused as busy counts as well. */
export function recordQueueDepth(depth: number): void {
  queueDepth.observe(depth);
}

const busyRefusals = new Counter({
  name: "task_object_busy_total",
  help: "Task-object requests refused at once (429 TaskObjectBusy): their name had its most requests waiting",
  registers: [registry],
});

/** Counts one TaskObjectBusy refusal. */
export function recordBusy(): void {
  busyRefusals.inc();
}

/** Sets the number of task-object activations held here. */
export function setActivations(count: number): void {
  taskObjectActivations.set(count);
}

/** Counts one forward to an owner: answered, no_responders, timeout or moved. */
export function recordForward(outcome: "answered" | "no_responders" | "timeout" | "moved"): void {
  taskObjectForwards.inc({ outcome });
}

/** Records one answered HTTP request. */
export function recordHttp(api: string, operation: string, status: number, seconds: number): void {
  httpRequests.observe(`${api} ${operation} ${status}`, () => ({ api, operation, status: String(status) }), seconds);
}

/** Records one answered actor request. */
export function recordActor(operation: string, status: number, seconds: number): void {
  actorHandling.observe(`${operation} ${status}`, () => ({ operation, status: String(status) }), seconds);
}

/** Runs before every scrape (e.g. to count instances by state). */
const collectors: (() => void)[] = [];
export function onScrape(collect: () => void): () => void {
  collectors.push(collect);
  return () => collectors.splice(collectors.indexOf(collect), 1);
}

/** The exposition text and its content type. */
export async function metricsText(): Promise<{ contentType: string; body: string }> {
  for (const collect of collectors) collect();
  return { contentType: registry.contentType, body: await registry.metrics() };
}

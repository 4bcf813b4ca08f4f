// Task-object load straight over NATS (no gateway): workers that each create a task in a random
// object and read it back, `inFlight` at once. Latencies per operation kind; every failure is
// counted by operation and `_tag` (a read that answers another task counts as "Mismatch").
import type { Histogram } from "hdr-histogram-js";
import { ClientError } from "../client/index.ts";
import { latencyHistogram } from "./latency.ts";
import { inPool } from "./nats-load.ts";
import type { TaskClient } from "./placement-client.ts";

export type OpKind = "createTaskDO" | "getTaskDO";
export const opKinds: readonly OpKind[] = ["createTaskDO", "getTaskDO"];

export interface OpStats {
  /** Completed successfully. */
  ops: number;
  p50: number;
  p99: number;
}

export interface LoadOutcome {
  /** Successful operations of both kinds. */
  ops: number;
  seconds: number;
  opsPerSecond: number;
  byKind: Record<OpKind, OpStats>;
  /** Failures by `<operation>:<_tag>`. */
  errors: Record<string, number>;
  errorCount: number;
  /** A few distinct failure messages, to say why `errorCount` is not 0. */
  errorSamples: string[];
}

export interface LoadSettings {
  names: readonly string[];
  inFlight: number;
  seconds: number;
}

/** The task-object names of a run: `bench-0` … `bench-<count-1>`. */
export const objectNames = (count: number): string[] => Array.from({ length: count }, (_, i) => `bench-${i}`);

function errorRecorder() {
  const errors: Record<string, number> = {};
  const samples = new Set<string>();
  return {
    errors,
    samples,
    record(kind: OpKind, err: unknown) {
      const tag = err instanceof ClientError ? err._tag : err instanceof Error ? err.name : "Unknown";
      const key = `${kind}:${tag}`;
      errors[key] = (errors[key] ?? 0) + 1;
      if (samples.size < 5) samples.add(`${key} ${err instanceof Error ? err.message : String(err)}`);
    },
  };
}

/** One create per name, so every object exists (and is placed) before anything is measured. */
export async function seedObjects(
  client: TaskClient,
  names: readonly string[],
  concurrency: number,
): Promise<{ errors: Record<string, number> }> {
  const recorder = errorRecorder();
  await inPool(names.length, concurrency, async (i) => {
    await client
      .createTaskDO({ title: `seed ${i}`, name: names[i]! })
      .catch((err: unknown) => recorder.record("createTaskDO", err));
  });
  return { errors: recorder.errors };
}

/**
 * Runs the create-then-read loop for `settings.seconds`. No operation starts after the
 * deadline; those in flight finish and count, over the time they actually took.
 */
export async function runTaskObjectLoad(client: TaskClient, settings: LoadSettings): Promise<LoadOutcome> {
  const latency: Record<OpKind, Histogram> = { createTaskDO: latencyHistogram(), getTaskDO: latencyHistogram() };
  const recorder = errorRecorder();
  const record = (kind: OpKind, sent: number) =>
    latency[kind].recordValue(Math.max(1, Math.round((performance.now() - sent) * 1000)));
  const started = performance.now();
  const deadline = started + settings.seconds * 1000;
  let sequence = 0;
  const worker = async () => {
    while (performance.now() < deadline) {
      const name = settings.names[Math.floor(Math.random() * settings.names.length)]!;
      const title = `load ${sequence++}`;
      let sent = performance.now();
      let created;
      try {
        created = await client.createTaskDO({ title, name });
        record("createTaskDO", sent);
      } catch (err) {
        recorder.record("createTaskDO", err);
        continue;
      }
      if (performance.now() >= deadline) break;
      sent = performance.now();
      try {
        const read = await client.getTaskDO({ id: created.id, name });
        if (read.id !== created.id || read.title !== title)
          throw Object.assign(new Error(`asked ${created.id}, got ${read.id}`), { name: "Mismatch" });
        record("getTaskDO", sent);
      } catch (err) {
        recorder.record("getTaskDO", err);
      }
    }
  };
  await Promise.all(Array.from({ length: settings.inFlight }, worker));
  const seconds = (performance.now() - started) / 1000;
  const stats = (h: Histogram): OpStats => ({
    ops: h.totalCount,
    p50: h.totalCount ? h.getValueAtPercentile(50) / 1000 : NaN,
    p99: h.totalCount ? h.getValueAtPercentile(99) / 1000 : NaN,
  });
  const byKind = { createTaskDO: stats(latency.createTaskDO), getTaskDO: stats(latency.getTaskDO) };
  const ops = byKind.createTaskDO.ops + byKind.getTaskDO.ops;
  return {
    ops,
    seconds,
    opsPerSecond: seconds > 0 ? ops / seconds : 0,
    byKind,
    errors: recorder.errors,
    errorCount: Object.values(recorder.errors).reduce((a, b) => a + b, 0),
    errorSamples: [...recorder.samples],
  };
}

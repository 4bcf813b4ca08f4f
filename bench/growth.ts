// The growth check: fills the task store with direct NATS creates (many in flight) and, at
// 0, 100k (and 1M…) records, samples the service's RSS and getTask latency. Records live in
// KV, so the service's memory must stay flat while the store on disk grows.
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { createTask, requestSubject } from "../schemas/index.ts";
import type { Environment } from "./environment.ts";
import { runHttpLoad } from "./http-load.ts";
import { inPool, replyStatus } from "./nats-load.ts";
import type { BenchOptions } from "./options.ts";
import { currentRssMiB } from "./proc.ts";
import { fixed, markdownTable, summarize, type Outcome, type SummaryRow } from "./report.ts";
import { saveResults } from "./results.ts";
import { measure } from "./rounds.ts";
import { waitForService } from "./seed.ts";
import { pause } from "./stats.ts";
import type { LoadSettings } from "./types.ts";

interface GrowthPoint {
  records: number;
  /** RSS right before the read load, after a pause. */
  idleRssMiB: Record<string, number>;
  storeMiB: number;
  /** Records per second of the fill that led here. */
  fillRate?: number;
  /** Each getTask read (one per round), and their medians. */
  reads: Outcome[];
  read: SummaryRow;
}

const fillInFlight = 256;
const reservoirSize = 1000;

/** Checkpoints: 0, each power of ten from 100k below `size`, and `size`. */
export function checkpoints(size: number): number[] {
  const points = [0];
  for (let p = 100_000; p < size; p *= 10) points.push(p);
  return [...points, size];
}

async function diskMiB(dir: string): Promise<number> {
  let bytes = 0;
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) bytes += (await stat(join(entry.parentPath, entry.name)).catch(() => ({ size: 0 }))).size;
  }
  return Math.round((bytes / 2 ** 20) * 10) / 10;
}

/** Creates `count` tasks straight over NATS; keeps a uniform sample of their ids in `ids`. */
async function fill(env: Environment, count: number, created: number, ids: string[]): Promise<number> {
  const subject = requestSubject(createTask, {});
  const body = new TextEncoder().encode(JSON.stringify({ title: "growth" }));
  const decoder = new TextDecoder();
  const started = performance.now();
  let done = 0;
  await inPool(count, fillInFlight, async () => {
    const reply = await env.nc.request(subject, body, { timeout: 30_000 });
    if (replyStatus(reply.headers) !== 200) throw new Error(`create answered ${decoder.decode(reply.data)}`);
    const seen = created + done++;
    const slot = seen < reservoirSize ? seen : Math.floor(Math.random() * (seen + 1));
    if (slot < reservoirSize) ids[slot] = (JSON.parse(decoder.decode(reply.data)) as { id: string }).id;
    if (done % Math.max(1, Math.floor(count / 10)) === 0) process.stdout.write(`  ${created + done} records\r`);
  });
  return count / ((performance.now() - started) / 1000);
}

function readRunner(env: Environment, ids: string[]) {
  let i = 0;
  const next = () => ({ method: "GET" as const, path: `/${ids[i++ % ids.length]}` });
  return (settings: LoadSettings) => runHttpLoad({ url: env.taskUrl, next }, settings);
}

async function samplePoint(env: Environment, options: BenchOptions, records: number, ids: string[]) {
  await pause(1_000);
  const idleRssMiB = currentRssMiB(env.groups("service"));
  const storeMiB = await diskMiB(env.storeDir);
  const settings = { connections: options.connections, duration: options.duration };
  const reads: Outcome[] = [];
  for (let round = 1; round <= options.rounds; round++) {
    reads.push(await measure(readRunner(env, ids), env.groups("service"), settings));
    await pause();
  }
  const rounds = reads.map((outcome, i) => ({ round: i + 1, results: { getTask: outcome } }));
  const [read] = summarize(rounds, ["getTask"], "getTask");
  return { records, idleRssMiB, storeMiB, reads, read: read! };
}

function formatGrowth(points: GrowthPoint[]): string {
  return markdownTable(
    [
      "records",
      "svc RSS idle MiB",
      "svc RSS peak MiB",
      "nats RSS MiB",
      "store MiB",
      "getTask req/s",
      "p50 ms",
      "p99 ms",
      "errors",
      "fill rec/s",
    ],
    points.map(({ records, idleRssMiB, storeMiB, read, fillRate }) => [
      records.toLocaleString("en-US"),
      fixed(0)(idleRssMiB.service),
      fixed(0)(read.serviceRssMiB),
      fixed(0)(read.natsRssMiB),
      fixed(1)(storeMiB),
      read.rounds ? fixed(0)(read.rps) : `failed: ${read.failures[0]}`,
      fixed(2)(read.p50),
      fixed(2)(read.p99),
      String(read.errors + read.unexpected),
      fixed(0)(fillRate),
    ]),
  );
}

export async function runGrowth(
  env: Environment,
  options: BenchOptions,
  header: Record<string, unknown>,
  startedAt: Date,
) {
  await waitForService(env.taskUrl);
  const ids: string[] = [];
  const points: GrowthPoint[] = [];
  let created = 0;
  // The 0 point reads a first batch of tasks: the sample needs something to read.
  for (const target of checkpoints(options.growthSize)) {
    const goal = Math.max(target, options.seedCount);
    let fillRate: number | undefined;
    if (goal > created) {
      console.log(`filling to ${goal.toLocaleString("en-US")} records (${fillInFlight} creates in flight)…`);
      fillRate = await fill(env, goal - created, created, ids);
      created = goal;
    }
    if (points.length === 0 && options.warmup > 0) {
      await readRunner(env, ids)({ connections: options.connections, duration: options.warmup }).catch(() => {});
    }
    const point = { ...(await samplePoint(env, options, created, ids)), fillRate };
    points.push(point);
    const { read } = point;
    console.log(
      `  ${created.toLocaleString("en-US")} records: service RSS ${point.idleRssMiB.service} MiB idle, ` +
        (read.rounds
          ? `getTask ${Math.round(read.rps)} req/s p50 ${read.p50.toFixed(2)} ms p99 ${read.p99.toFixed(2)} ms`
          : `getTask failed: ${read.failures[0]}`),
    );
  }
  console.log(
    `\ngrowth: service RSS and getTask (median of ${options.rounds} × ${options.duration} s, ` +
      `${options.connections} connections) by record count\n`,
  );
  console.log(formatGrowth(points));
  await saveResults({ ...header, points }, startedAt, "growth");
}

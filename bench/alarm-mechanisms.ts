// The mechanisms behind object alarms and storage quotas, measured on a private nats-server:
// JetStream message schedules (publish rate, a burst due at one instant fired through the hosts'
// consumer, lateness of sparse alarms, alarms firing after a SIGKILL and restart) against a KV of
// due times swept by the hosts (one sweep of the bucket); and a put's usage count kept by a
// counter stream against an atomic batch with a per-principal usage key. Prints the figures.
//   npm run bench:alarms                 # RECORDS=100000
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jetstream } from "@nats-io/jetstream";
import { headers, type MsgHdrs } from "@nats-io/transport-node";
import {
  connectNats,
  OBJECT_ALARMS_STREAM,
  provisionObjectStreams,
  startNatsServer,
  type NatsHandle,
  type NatsServer,
} from "../platform/index.ts";
import { startAlarmFiring } from "../vm-runtime/objects/index.ts";
import { readPage } from "../vm-runtime/objects/pages.ts";
import { percentiles } from "./stats.ts";

const RECORDS = Number(process.env.RECORDS ?? 100_000);
const IN_FLIGHT = 500;
const PUTS = Number(process.env.PUTS ?? 4_000);

const dir = await mkdtemp(join(tmpdir(), "alarm-bench-"));
let server: NatsServer = await startNatsServer({ storeDir: dir });
let nats: NatsHandle = await connectNats({ servers: server.url, name: "bench:alarms" });
const rows: Record<string, string | number> = {};
const row = (name: string, value: string | number) => {
  rows[name] = value;
  console.log(`${name}: ${value}`);
};

/** Runs `count` requests, `IN_FLIGHT` at a time; the seconds it took. */
async function window(count: number, send: (i: number) => Promise<unknown>): Promise<number> {
  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(IN_FLIGHT, count) }, async () => {
      while (next < count) await send(next++);
    }),
  );
  return (performance.now() - start) / 1000;
}

/** Publishes `subject` with `h`, failing on a refused ack. */
async function write(subject: string, h: MsgHdrs | undefined, data = ""): Promise<{ seq?: number; val?: string }> {
  const ack = (await nats.requester.request(subject, data, 10_000, h)).json<{
    seq?: number;
    val?: string;
    error?: { description: string };
  }>();
  if (ack.error) throw new Error(ack.error.description);
  return ack;
}

const scheduleHeaders = (key: string, at: number) => {
  const h = headers();
  h.set("Nats-Schedule", `@at ${new Date(at).toISOString()}`);
  h.set("Nats-Schedule-Target", `objalarm.fire.${key}`);
  return h;
};

/** Starts the firing consumer; `fired` resolves once `count` alarms fired (their times, epoch ms). */
async function fireAll(count: number) {
  const times: number[] = [];
  let done: () => void = () => {};
  const fired = new Promise<void>((resolve) => (done = resolve));
  const firing = await startAlarmFiring(
    nats.nc,
    async () => {
      times.push(Date.now());
      if (times.length === count) done();
    },
    { concurrency: 512 },
  );
  return { times, fired, close: () => firing.close() };
}

async function schedules() {
  await provisionObjectStreams(nats.nc);
  // A burst: every alarm due at one instant, set far enough ahead to be all published first
  // (the publish rate of a probe says how far: a late due time would overlap the two figures).
  const probe = Math.min(5_000, RECORDS);
  const probed = await window(probe, (i) =>
    write(`objalarm.sched.p.i.probe${i}`, scheduleHeaders(`p.i.probe${i}`, Date.now() + 3_600_000)),
  );
  await nats.requester.request(
    `$JS.API.STREAM.PURGE.${OBJECT_ALARMS_STREAM}`,
    JSON.stringify({ filter: "objalarm.sched.p.i.>" }),
    10_000,
  );
  const due = Date.now() + Math.max(5_000, 2 * (RECORDS / (probe / probed)) * 1000);
  const published = await window(RECORDS, (i) => write(`objalarm.sched.p.i.b${i}`, scheduleHeaders(`p.i.b${i}`, due)));
  if (Date.now() > due)
    console.log("(the burst fell due before its last schedule was published: its rate is not a burst's)");
  row("schedules published /s", Math.round(RECORDS / published));
  const burst = await fireAll(RECORDS);
  await burst.fired;
  const last = Math.max(...burst.times);
  row("burst fired /s (from the due time)", Math.round(RECORDS / ((last - due) / 1000)));
  row("burst: first fired after due (ms)", Math.round(Math.min(...burst.times) - due));
  await burst.close();
  const stream = await nats.requester.request(`$JS.API.STREAM.INFO.${OBJECT_ALARMS_STREAM}`, undefined, 5_000);
  row("alarm stream messages after acks", stream.json<{ state: { messages: number } }>().state.messages);

  // Sparse: 200 alarms spread over 4 s.
  const sparse = await fireAll(200);
  const start = Date.now() + 500;
  const times = new Map<string, number>();
  await window(200, async (i) => {
    const at = start + Math.floor((i / 200) * 4_000);
    times.set(`p.i.s${i}`, at);
    await write(`objalarm.sched.p.i.s${i}`, scheduleHeaders(`p.i.s${i}`, at));
  });
  await sparse.fired;
  await sparse.close();
  const lateness = [...times.values()]
    .sort((a, b) => a - b)
    .map((at, i) => sparse.times.sort((a, b) => a - b)[i]! - at);
  const spread = percentiles(lateness);
  row("sparse lateness p50 / p99 / max (ms)", `${spread.p50} / ${spread.p99} / ${Math.max(...lateness)}`);

  // Durability: 100 alarms set, the server SIGKILLed and started again before they are due.
  const restartDue = Date.now() + 3_000;
  await window(100, (i) => write(`objalarm.sched.p.i.r${i}`, scheduleHeaders(`p.i.r${i}`, restartDue)));
  await nats.close();
  const exited = new Promise((resolve) => server.process.once("exit", resolve));
  server.process.kill("SIGKILL");
  await exited;
  server = await startNatsServer({ storeDir: dir, port: server.port });
  nats = await connectNats({ servers: server.url, name: "bench:alarms" });
  const restarted = await fireAll(100);
  const deadline = new Promise((resolve) => setTimeout(resolve, 30_000));
  await Promise.race([restarted.fired, deadline]);
  row("fired after SIGKILL + restart", `${restarted.times.length}/100`);
  await restarted.close();
}

async function kvSweep() {
  await nats.requester.request(
    "$JS.API.STREAM.CREATE.KV_due",
    JSON.stringify({
      name: "KV_due",
      subjects: ["$KV.due.>"],
      max_msgs_per_subject: 1,
      allow_direct: true,
      allow_rollup_hdrs: true,
      deny_delete: true,
    }),
    5_000,
  );
  const far = Date.now() + 3_600_000;
  await window(RECORDS, (i) => write(`$KV.due.p.i.k${i}`, undefined, String(far + i)));
  // A sweep reads every key once, as a host would: an ordered consumer over the bucket.
  const sweeps: number[] = [];
  for (let s = 0; s < 3; s++) {
    const start = performance.now();
    const consumer = await jetstream(nats.nc).consumers.get("KV_due");
    const messages = await consumer.consume({ max_messages: 10_000 });
    let dueNow = 0;
    for await (const m of messages) {
      if (Number(m.string()) <= Date.now()) dueNow++;
      if (m.info.pending === 0) break;
    }
    await messages.close();
    sweeps.push(performance.now() - start);
    if (dueNow !== 0) throw new Error("no alarm of the sweep is due");
  }
  row(`one sweep of a ${RECORDS}-key bucket (ms, 3 sweeps)`, sweeps.map((ms) => Math.round(ms)).join(" / "));
  // An object's list page (objects/storage.ts) in a bucket that holds these keys besides its own.
  await window(250, (i) => write(`$KV.due.p.i.target.k${i}`, undefined, "1"));
  const pages: number[] = [];
  for (let i = 0; i < 3; i++) {
    const start = performance.now();
    await readPage(nats.requester, "KV_due", "$KV.due.p.i.target.*", 0, 100, 60_000);
    pages.push(performance.now() - start);
  }
  row(
    `list page of 100 of 250 keys in a ${RECORDS}-key bucket (ms, 3 reads)`,
    pages.map((ms) => ms.toFixed(1)).join(" / "),
  );
}

/** Puts fenced by a lease, their bytes counted: by a counter stream, or by an atomic batch. */
async function usageCost() {
  await nats.requester.request(
    "$JS.API.STREAM.CREATE.KV_bench",
    JSON.stringify({
      name: "KV_bench",
      subjects: ["$KV.bench.>"],
      max_msgs_per_subject: 1,
      allow_direct: true,
      allow_atomic: true,
    }),
    5_000,
  );
  const lease = (await write("$KV.bench.lease", undefined, "holder")).seq!;
  const fence = () => {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(lease));
    h.set("Nats-Expected-Last-Subject-Sequence-Subject", "$KV.bench.lease");
    return h;
  };
  const value = "x".repeat(100);
  const counter = async (writer: number, i: number) => {
    const h = headers();
    h.set("Nats-Incr", "+104");
    await write("objusage.bench", h);
    await write(`$KV.bench.w${writer}.k${i}`, fence(), value);
  };
  let usageRevision = (await write("$KV.bench.usage", undefined, "0")).seq!;
  let usageBytes = 0;
  let conflicts = 0;
  let batches = 0;
  const batch = async (writer: number, i: number) => {
    for (;;) {
      const id = `b${batches++}`;
      const first = fence();
      first.set("Nats-Batch-Id", id);
      first.set("Nats-Batch-Sequence", "1");
      // Answered with an empty message once the server holds it (a plain publish was slower).
      await nats.requester.request(`$KV.bench.w${writer}.k${i}`, value, 10_000, first);
      const commit = headers();
      commit.set("Nats-Batch-Id", id);
      commit.set("Nats-Batch-Sequence", "2");
      commit.set("Nats-Batch-Commit", "1");
      commit.set("Nats-Expected-Last-Subject-Sequence", String(usageRevision));
      const ack = (await nats.requester.request("$KV.bench.usage", String(usageBytes + 104), 10_000, commit)).json<{
        seq?: number;
        error?: unknown;
      }>();
      if (ack.seq !== undefined) {
        usageRevision = ack.seq;
        usageBytes += 104;
        return;
      }
      conflicts++;
      const last = await nats.requester.request("$JS.API.DIRECT.GET.KV_bench.$KV.bench.usage", undefined, 10_000);
      usageRevision = Number(last.headers?.get("Nats-Sequence"));
      usageBytes = Number(last.string());
    }
  };
  for (const [name, put] of [
    ["counter stream", counter],
    ["atomic batch", batch],
  ] as const) {
    for (const writers of [1, 8]) {
      conflicts = 0;
      const each = Math.floor(PUTS / writers);
      const start = performance.now();
      await Promise.all(
        Array.from({ length: writers }, async (_, w) => {
          for (let i = 0; i < each; i++) await put(w + writers * 100, i);
        }),
      );
      const seconds = (performance.now() - start) / 1000;
      const extra = name === "atomic batch" ? `, ${conflicts} usage conflicts retried` : "";
      row(
        `usage by ${name}, ${writers} objects of one principal: puts /s`,
        `${Math.round((each * writers) / seconds)}${extra}`,
      );
    }
  }
}

try {
  console.log(`alarm and usage mechanisms, ${RECORDS} records, nats-server ${nats.nc.info?.version}`);
  await schedules();
  await kvSweep();
  await usageCost();
  console.log(JSON.stringify({ records: RECORDS, rows }));
} finally {
  await nats.close();
  await server.stop();
  await rm(dir, { recursive: true, force: true });
}

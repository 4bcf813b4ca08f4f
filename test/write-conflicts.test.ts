// Compare-and-set writes on a replicated (R3) bucket, many at once on one key, as task-object
// leases, idempotent creates and microVM records make them: one wins and every other one is a
// conflict, never an error. nats-server 2.15 answers those on R3 with err_code 10164 where 2.10
// answered 10071 (a partition fault run turned them into 500s before both codes were known).
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { MicrovmStore, type MicrovmRecord } from "../vm-runtime/service/index.ts";
import { startNatsCluster, waitForJetStream } from "../cluster/index.ts";
import { bucketNames, CONFLICT, recordStore, Requester, versionedStore } from "../platform/index.ts";
import { isObjectRecord, updateRecord } from "../actors/records.ts";
import { lifo } from "./helpers/defer.ts";
import { natsSource } from "./helpers/nats.ts";

const noLocalNats = await natsSource({ private: true }).then(
  (source) => (source === "local" ? undefined : "needs a local nats-server to run a cluster"),
  () => "needs a local nats-server to run a cluster",
);
const AT_ONCE = 20;

/** How many of `outcomes` are each kind, e.g. `{ written: 1, conflict: 19 }`. */
function tally<T>(outcomes: readonly T[], kind: (outcome: T) => string): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const outcome of outcomes) counts[kind(outcome)] = (counts[kind(outcome)] ?? 0) + 1;
  return counts;
}

describe("write conflicts", () => {
  it("write conflicts - 20 writes at once on one key of an R3 bucket: one is written, 19 are conflicts, none an error", {
    skip: noLocalNats,
  }, async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const baseDir = await mkdtemp(join(tmpdir(), "write-conflicts-"));
    defer(() => rm(baseDir, { recursive: true, force: true }));
    const cluster = await startNatsCluster({ baseDir, names: ["c1", "c2", "c3"], clusterName: "conflicts" });
    defer(() => cluster.stop());
    await waitForJetStream(cluster.url, { replicas: 3 });
    const nc = await connect({ servers: cluster.url.split(",") });
    defer(() => nc.close());
    const requester = new Requester(nc);
    const atOnce = <T>(write: () => Promise<T>) => Promise.all(Array.from({ length: AT_ONCE }, write));
    const expected = { written: 1, conflict: AT_ONCE - 1 };

    // Idempotent creates (tasks, jobs, task-object records).
    const tasks = recordStore(requester, bucketNames.tasks, { replicas: 3 });
    const creates = await atOnce(() => tasks.create("one-task", new TextEncoder().encode("{}")));
    assert.deepEqual(
      tally(creates, (c) => (c === "exists" ? "conflict" : "written")),
      expected,
      "record store",
    );

    // A request's update sent again while its first write is still being stored (same write
    // id): the server answers "duplicate message id is in process", read as a moved revision,
    // so updateRecord reads again and answers the stored write, never an error.
    const first = await tasks.entry("one-task");
    const sameWrite = crypto.randomUUID();
    const repeats = await atOnce(() =>
      tasks.update("one-task", new TextEncoder().encode('{"n":1}'), first!.revision, sameWrite),
    );
    const kinds = tally(repeats, (u) => (u === "moved" ? "moved" : `written at ${u.revision}`));
    t.diagnostic(`${AT_ONCE} updates with one write id at once: ${JSON.stringify(kinds)}`);
    assert.equal(Object.keys(kinds).filter((k) => k !== "moved").length, 1, "one revision written");
    const last = await tasks.entry("one-task");
    assert.equal(last?.writtenBy, sameWrite);
    const again = await updateRecord<{ n: number }>(tasks, "one-task", isObjectRecord, () => ({ n: 2 }), {
      writeId: sameWrite,
      mismatch: () => new Error("no If-Match here"),
    });
    assert.equal(again?.revision, last?.revision, "a repeat answers the stored write");

    // Task-object leases: revision-checked writes.
    const leases = versionedStore(requester, bucketNames.taskObjectLeases);
    const revision = await leases.put("one-name", "first", 0);
    assert.equal(typeof revision, "number");
    const claims = await atOnce(() => leases.put("one-name", "claim", revision as number));
    assert.deepEqual(
      tally(claims, (c) => (c === CONFLICT ? "conflict" : "written")),
      expected,
      "lease store",
    );

    // MicroVM records (nats.js KV create underneath).
    const store = new MicrovmStore(await new Kvm(nc).open(bucketNames.microvms), nc);
    const record: MicrovmRecord = {
      microvmId: crypto.randomUUID(),
      imageIdentifier: "sandbox",
      state: "PENDING",
      endpoint: "127.0.0.1:1",
      idlePolicy: { maxIdleDurationSeconds: 60, suspendedDurationSeconds: 60, autoResumeEnabled: false },
      startedAt: new Date().toISOString(),
      hostId: "host-1",
      updatedAt: new Date().toISOString(),
    };
    const records = await atOnce(() => store.create(record));
    assert.deepEqual(
      tally(records, (r) => (r === undefined ? "conflict" : "written")),
      expected,
      "microVM store",
    );
  });
});

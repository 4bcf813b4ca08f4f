// Scale-out under faults: three clustered nats-server processes (R3), two gateways and three
// actor processes, steady create/get load on 20 task objects. One actor process is SIGKILLed,
// one NATS node is SIGKILLed, one owner is paused with SIGSTOP past its lease and resumed.
// Checked: no write answered 200 is lost, activations of a name never overlap, every write
// left inside its activation, and every name answers again within the bound.
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { httpClient } from "../../client/index.ts";
import { bucketLeader, leadersBack, startCluster, startRole, type RoleProcess } from "../../cluster/index.ts";
import { authDirOf, bucketNames } from "../../platform/index.ts";
import { taskApi } from "../../schemas/index.ts";
import { activationIntervals, overlaps, writesOutside, type ActivationInterval } from "../helpers/activations.ts";
import { lifo } from "../helpers/defer.ts";
import { activationLog, activationLogEnv, faultTopology } from "../helpers/fault-cluster.ts";
import { natsSource } from "../helpers/nats.ts";
import { FAILOVER_BOUND_MS, NATS_NODE_BOUND_MS, PAUSED_OWNER_BOUND_MS } from "../helpers/fault-bounds.ts";
import {
  assertNoStaleReads,
  objectLoadBuckets,
  readsAsWritten,
  recoveryAfter,
  startObjectLoad,
} from "../helpers/object-load.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const noLocalNats = await natsSource({ private: true }).then(
  (source) => (source === "local" ? undefined : "needs a local nats-server to run a cluster"),
  () => "needs a local nats-server to run a cluster",
);

const STEADY_MS = 3_000;

it("placement cluster - 3 NATS nodes, 2 gateways, 3 actor processes: actor kill, NATS node kill, SIGSTOP of an owner", {
  skip: noLocalNats,
  timeout: 240_000,
}, async (t) => {
  const defer = lifo((fn) => t.after(fn));
  const baseDir = await mkdtemp(join(tmpdir(), "placement-cluster-"));
  defer(() => rm(baseDir, { recursive: true, force: true }));
  const topology = faultTopology;
  const { events, processOf: ownerOf, onLine } = activationLog();
  const env = activationLogEnv;
  const cluster = await startCluster(topology, { baseDir, onLine, env });
  defer(() => cluster.stop());
  const extra: RoleProcess[] = [];
  defer(() => Promise.all(extra.map((p) => p.stop())));
  const actors = new Map(cluster.services.filter((s) => s.role === "actors").map((s) => [s.name, s]));
  const urls = cluster.gateways.map((g) => `http://127.0.0.1:${g.ports!.task}`);

  const names = Array.from({ length: 20 }, (_, i) => `object-${i + 1}`);
  const load = startObjectLoad(names, urls, { updates: true });
  defer(() => load.stop());
  const diedAt: Record<string, number> = {};
  const report: string[] = [];

  /** The live process holding the most names now (by its activation log). */
  const busiestOwner = () => {
    const open = activationIntervals(events).filter((i) => i.end === undefined && diedAt[i.owner] === undefined);
    const counts = new Map<string, number>();
    for (const i of open) counts.set(i.owner, (counts.get(i.owner) ?? 0) + 1);
    const [owner, held] = [...counts].sort((a, b) => b[1] - a[1])[0] ?? [];
    assert.ok(owner, "some process holds names");
    return { owner, held: held!, process: actors.get(ownerOf.get(owner)!)! };
  };
  /** Gives the fault `boundMs`, then checks that no name went longer without a 200 across it. */
  const recovery = async (label: string, since: number, boundMs: number) => {
    const outage = await recoveryAfter(load, names, since, boundMs).catch((err: Error) =>
      assert.fail(`${label}: ${err.message}`),
    );
    const line =
      `${label}: longest time a name went without a 200: ${outage.ms} ms (${outage.name}); failed ` +
      `attempts: ${outage.failures}`;
    report.push(line);
    t.diagnostic(line);
    if (process.env.DEBUG_PLACEMENT) {
      t.diagnostic(
        `DEBUG ${outage.name}: ` +
          load.attempts
            .filter((a) => a.name === outage.name && a.at >= since - 500 && a.at < since + outage.ms + 1000)
            .map((a) => `${a.at - since}:${a.outcome}`)
            .join(" "),
      );
      t.diagnostic(
        "DEBUG events: " +
          events
            .filter((e) => e.name === outage.name && e.event !== "write")
            .map((e) => `${e.process}:${e.event}@${e.at - since}:${e.reason ?? ""}`)
            .join(" "),
      );
    }
    assert.ok(outage.ms <= boundMs, `${label}: a name was unanswered for ${outage.ms} ms (bound ${boundMs} ms)`);
  };

  await sleep(STEADY_MS);
  assert.ok(load.answered.length > 20, `steady load answered ${load.answered.length} creates`);

  // 1. SIGKILL the actor process holding the most names; start a fresh one in its place.
  const victim = busiestOwner();
  const killedAt = Date.now();
  victim.process.child.kill("SIGKILL");
  // Dead once the kill has returned: a write it logged between `killedAt` and the signal is its own.
  diedAt[victim.owner] = Date.now();
  t.diagnostic(`SIGKILL ${victim.process.name} holding ${victim.held} names`);
  await recovery(`actor SIGKILL (${victim.held} names)`, killedAt, FAILOVER_BOUND_MS);
  const replacement = await startRole({
    name: `${victim.process.name}-replacement`,
    role: "actors",
    natsUrl: cluster.nats.url,
    dataDir: join(baseDir, `${victim.process.name}-replacement`),
    runDir: baseDir,
    env: { ...env, KV_REPLICAS: String(topology.replicas), NATS_AUTH_DIR: authDirOf(baseDir) },
    onLine,
  });
  extra.push(replacement);
  actors.delete(victim.process.name);
  actors.set(replacement.name, replacement);
  await sleep(STEADY_MS);

  // 2. SIGKILL the NATS node leading the lease bucket; start it again once all names answer.
  const leader = await bucketLeader(cluster.nats.url, bucketNames.taskObjectLeases, cluster.credentials.gateway);
  const node = cluster.nats.nodes.find((n) => n.name === leader);
  assert.ok(node, `lease bucket leader ${leader} is a node of the cluster`);
  const nodeKilledAt = Date.now();
  await node.kill();
  t.diagnostic(`SIGKILL NATS node ${node.name} (leader of ${bucketNames.taskObjectLeases})`);
  // JetStream's part (the Raft elections) is measured, the service's part bounded after it.
  const ledMs = await leadersBack(
    cluster.nats.url,
    objectLoadBuckets,
    node.name,
    cluster.credentials.gateway,
    nodeKilledAt,
  );
  t.diagnostic(`${objectLoadBuckets.join(" and ")} led again ${ledMs} ms after the kill`);
  await recovery(`NATS node SIGKILL (lease bucket leader)`, nodeKilledAt, ledMs + NATS_NODE_BOUND_MS);
  await node.start();
  await sleep(STEADY_MS);

  // 3. SIGSTOP the busiest owner until every name it held is activated elsewhere, then
  // SIGCONT: it must notice its leases lapsed, and neither serve nor write on.
  const paused = busiestOwner();
  const pausedNames = activationIntervals(events)
    .filter((i) => i.owner === paused.owner && i.end === undefined)
    .map((i) => i.name);
  const stoppedAt = Date.now();
  process.kill(paused.process.pid, "SIGSTOP");
  defer(() => {
    try {
      process.kill(paused.process.pid, "SIGCONT"); // in case the test failed while it was stopped
    } catch {
      /* already gone */
    }
  });
  t.diagnostic(`SIGSTOP ${paused.process.name} holding ${paused.held} names`);
  const takenOver = () =>
    pausedNames.every((name) =>
      events.some((e) => e.name === name && e.event === "start" && e.owner !== paused.owner && e.at > stoppedAt),
    );
  for (const deadline = Date.now() + 30_000; !takenOver(); await sleep(100)) {
    assert.ok(Date.now() < deadline, "the paused owner's names were taken over within 30 s");
  }
  const takeoverMs = Date.now() - stoppedAt;
  await sleep(500);
  process.kill(paused.process.pid, "SIGCONT");
  t.diagnostic(
    `SIGCONT after ${Date.now() - stoppedAt} ms; all ${pausedNames.length} names activated elsewhere after ` +
      `${takeoverMs} ms`,
  );
  await recovery(`owner SIGSTOP (${paused.held} names)`, stoppedAt, PAUSED_OWNER_BOUND_MS);
  await sleep(STEADY_MS);
  await load.stop();

  // No read of an acknowledged create answered 404 during the faults (the load retries until
  // 200, so a stale read is only seen here), and every one reads back now, through both gateways.
  assertNoStaleReads(load.attempts, (line) => t.diagnostic(line));
  const clients = urls.map((url) => httpClient(taskApi, url));
  for (const [i, write] of load.answered.entries()) {
    const task = await clients[i % 2]!.getTaskDO({ id: write.id, name: write.name });
    assert.ok(readsAsWritten(write, task), `${JSON.stringify(task)} for ${JSON.stringify(write)}`);
  }
  // Activations never overlap; writes left only inside their activation. The paused process
  // logged its ends after SIGCONT, at the last moment its leases allowed it to serve.
  await sleep(500); // the last log lines
  const intervals: ActivationInterval[] = activationIntervals(events);
  assert.deepEqual(overlaps(intervals, diedAt), []);
  assert.deepEqual(writesOutside(intervals, events, diedAt), []);
  // Each name the paused process held: its activation there ended by expiry at the lease's
  // end (logged after SIGCONT), before the next owner started.
  for (const name of pausedNames) {
    const ended = intervals.find(
      (i) =>
        i.name === name && i.owner === paused.owner && i.start < stoppedAt && i.end !== undefined && i.end >= stoppedAt,
    );
    assert.ok(ended, `${name}: the paused owner's activation ended`);
    assert.ok(ended.reason === "expired" || ended.reason === "lost", `${name}: ended by ${ended.reason}`);
  }
  const updates = load.answered.filter((w) => w.updated).length;
  const summary =
    `${load.answered.length} creates and ${updates} updates answered 200, all read back; ` +
    `${intervals.length} activations, ${events.filter((e) => e.event === "write").length} writes, no overlap`;
  t.diagnostic(summary);
  report.push(summary);
});

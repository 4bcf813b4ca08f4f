// Network partitions of the 3-node NATS cluster (iptables on loopback, test/helpers/partition.ts)
// under steady task-object and task load through two gateways and three actor processes: one
// node cut from the other two for 10 s, then the node an owner of names is connected to (a
// minority holding an owner). Checked: no create answered 200 is lost or reads 404 (a read of
// another gateway's write included), activations of a name never overlap, the minority side
// answers 503/504 and nothing else, and every name answers again within the bound after the heal.
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { httpClient } from "../../client/index.ts";
import { bucketLeader, startCluster, type NatsNode } from "../../cluster/index.ts";
import { bucketNames } from "../../platform/index.ts";
import { taskApi } from "../../schemas/index.ts";
import { activationIntervals, overlaps, writesOutside } from "../helpers/activations.ts";
import { lifo } from "../helpers/defer.ts";
import { activationLog, activationLogEnv, faultTopology } from "../helpers/fault-cluster.ts";
import { startLoad, statusCounts } from "../helpers/load.ts";
import { natsSource } from "../helpers/nats.ts";
import { failureTally, longestOutage, startObjectLoad, type Attempt } from "../helpers/object-load.ts";
import { connectedPort, partitions } from "../helpers/partition.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const noLocalNats = await natsSource({ private: true }).then(
  (source) => (source === "local" ? undefined : "needs a local nats-server to run a cluster"),
  () => "needs a local nats-server to run a cluster",
);

const PARTITION_MS = 10_000;
/** After the heal, every name and both gateways' task creates answer 200 again within this. */
const HEAL_BOUND_MS = 10_000;
const STEADY_MS = 3_000;

it("partitions - one NATS node cut off, then the node of a task-object owner: nothing acknowledged lost, one activation per name", {
  skip: noLocalNats,
  timeout: 300_000,
}, async (t) => {
  const defer = lifo((fn) => t.after(fn));
  const baseDir = await mkdtemp(join(tmpdir(), "partition-"));
  defer(() => rm(baseDir, { recursive: true, force: true }));
  const made = partitions(baseDir);
  if (typeof made === "string") return t.skip(made);
  const tool = made;
  defer(() => tool.close());
  const topology = faultTopology;
  const { events, processOf: ownerOf, onLine } = activationLog();
  const env = activationLogEnv;
  const cluster = await startCluster(topology, { baseDir, onLine, env, natsBinary: tool.binary });
  defer(() => cluster.stop());
  for (const line of cluster.natsRestarts) t.diagnostic(line);
  defer(() => tool.heal()); // before the stop: a cut node would hold up its peers' shutdown
  const urls = cluster.gateways.map((g) => `http://127.0.0.1:${g.ports!.task}`);
  const nodes = cluster.nats.nodes;
  const routePorts = nodes.map((n) => n.routePort);
  const nodeOf = (pid: number) =>
    nodes.find(
      (n) =>
        n.port ===
        connectedPort(
          pid,
          nodes.map((m) => m.port),
        ),
    );

  // Most names are read back through the gateway that created them, some through the other.
  const names = Array.from({ length: 20 }, (_, i) => `object-${i + 1}`);
  const load = startObjectLoad(names.slice(0, 16), urls);
  const crossLoad = startObjectLoad(names.slice(16), urls, { readElsewhere: true });
  const tasks = startLoad(
    urls.map((url) => ({
      url: `${url}/`,
      body: () => ({ title: "partition" }),
      idOf: (a) => (a as { id: string }).id,
    })),
    4,
  );
  defer(() => Promise.all([load.stop(), crossLoad.stop(), tasks.stop()]));
  const attempts = (): Attempt[] => [...load.attempts, ...crossLoad.attempts];
  const report: string[] = [];
  const say = (line: string) => (report.push(line), t.diagnostic(line));

  /** Cuts `node` off for PARTITION_MS, heals, and checks the minority's answers and the recovery. */
  async function partitionRound(label: string, node: NatsNode) {
    const minority = cluster.services.filter((s) => nodeOf(s.pid) === node).map((s) => s.name);
    const minorityGateways = cluster.gateways.flatMap((g, i) => (minority.includes(g.name) ? [i] : []));
    const cutAt = Date.now();
    tool.cut(node.name, node.routePort, routePorts);
    say(`${label}: cut ${node.name} off with ${minority.join(", ") || "no service process"} on its side`);
    await sleep(PARTITION_MS);
    tool.heal();
    const healedAt = Date.now();
    const answeringAgain = () =>
      names.every((name) => attempts().some((a) => a.name === name && a.ok && a.at >= healedAt)) &&
      urls.every((_, i) => tasks.answers.some((a) => a.target === i && a.status === 200 && a.at >= healedAt));
    for (const deadline = healedAt + 60_000; !answeringAgain(); await sleep(100)) {
      assert.ok(
        Date.now() < deadline,
        `${label}: still failing 60 s after the heal: ${failureTally(attempts(), healedAt)}`,
      );
    }
    const recoveredMs = Date.now() - healedAt;
    const during = attempts().filter((a) => a.at >= cutAt && a.at < healedAt + recoveredMs);
    const minorityFailures = during.filter((a) => !a.ok && minorityGateways.includes(a.via));
    // Names whose workers use only the majority's gateways: they should be served during the cut.
    const majorityNames = names.filter((n) =>
      attempts().every((a) => a.name !== n || !minorityGateways.includes(a.via)),
    );
    const majorityOutage = longestOutage(attempts(), majorityNames, cutAt, healedAt);
    say(
      `${label}: every name and task create answered 200 again ${recoveredMs} ms after the heal; ` +
        `through the majority's gateways the longest time a name went without a 200 during the cut: ${majorityNames.length === 0 ? "no such name" : majorityOutage ? `${majorityOutage.ms} ms (${majorityOutage.name})` : "a name had no 200 in the whole cut"}; ` +
        `failed attempts: ${failureTally(during, cutAt)}; task creates: ${JSON.stringify(statusCounts(tasks.answers.filter((a) => a.at >= cutAt)))}`,
    );
    assert.deepEqual(
      during.filter((a) => a.outcome.startsWith("404") || a.outcome.startsWith("500")),
      [],
      `${label}: no 404 or 500 for a created record`,
    );
    assert.deepEqual(
      [...new Set(minorityFailures.map((a) => a.outcome))].filter((o) => !/^50[34] /.test(o)),
      [],
      `${label}: the minority side answers 503 or 504`,
    );
    assert.ok(
      recoveredMs <= HEAL_BOUND_MS,
      `${label}: answering again ${recoveredMs} ms after the heal (bound ${HEAL_BOUND_MS} ms)`,
    );
  }

  await sleep(STEADY_MS);
  assert.ok(load.answered.length > 20, `steady load answered ${load.answered.length} creates`);

  // 1. The node leading the lease bucket: its raft groups lose their quorum, the others elect.
  const leader = await bucketLeader(cluster.nats.url, bucketNames.taskObjectLeases, cluster.credentials.gateway);
  await partitionRound("lease bucket leader's node", nodes.find((n) => n.name === leader) ?? nodes[0]!);
  await sleep(STEADY_MS);

  // 2. The node the busiest owner is connected to: its names must move to the majority side.
  const open = activationIntervals(events).filter((i) => i.end === undefined);
  const counts = new Map<string, number>();
  for (const i of open) counts.set(i.owner, (counts.get(i.owner) ?? 0) + 1);
  const [owner] = [...counts].sort((a, b) => b[1] - a[1])[0] ?? [];
  assert.ok(owner, "some process holds names");
  const ownerProcess = cluster.services.find((s) => s.name === ownerOf.get(owner))!;
  const ownerNode = nodeOf(ownerProcess.pid);
  assert.ok(ownerNode, `${ownerProcess.name} is connected to a node`);
  const heldBefore = open.filter((i) => i.owner === owner).map((i) => i.name);
  const cutAt = Date.now();
  await partitionRound(`owner's node (${ownerProcess.name}, ${heldBefore.length} names)`, ownerNode);
  const movedAway = heldBefore.filter((name) =>
    events.some((e) => e.name === name && e.event === "start" && e.owner !== owner && e.at > cutAt),
  );
  say(
    `${movedAway.length} of the ${heldBefore.length} names ${ownerProcess.name} held were activated on the majority side during the cut or after`,
  );
  await sleep(STEADY_MS);
  await Promise.all([load.stop(), crossLoad.stop(), tasks.stop()]);

  // Every create answered 200 reads back through both gateways.
  const clients = urls.map((url) => httpClient(taskApi, url));
  const writes = [...load.answered, ...crossLoad.answered];
  for (const write of writes) {
    for (const client of clients)
      assert.deepEqual(await client.getTaskDO({ id: write.id, name: write.name }), {
        id: write.id,
        title: write.title,
        completed: false,
      });
  }
  const taskWrites = tasks.answers.filter((a) => a.status === 200);
  for (const write of taskWrites) {
    for (const url of urls)
      assert.equal((await fetch(`${url}/${write.id}`)).status, 200, `task ${write.id} reads back`);
  }
  await sleep(500); // the last log lines
  const intervals = activationIntervals(events);
  assert.deepEqual(overlaps(intervals), []);
  assert.deepEqual(writesOutside(intervals, events), []);
  say(
    `${writes.length} task-object creates and ${taskWrites.length} task creates answered 200, all read back through both gateways; ${intervals.length} activations, no overlap`,
  );
});

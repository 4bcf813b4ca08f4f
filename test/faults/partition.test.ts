// Network partitions of the 3-node NATS cluster (iptables on loopback, test/helpers/partition.ts)
// under steady task-object and task load through the cluster's two gateways and one more gateway
// pinned to each node (so requests enter on both sides of any cut), three actor processes: the
// node leading the lease bucket cut from the other two, then the node an owner of names is
// connected to. Checked: no create answered 200 is lost or reads 404 (a read of another
// gateway's write included), activations of a name never overlap, the majority side keeps
// serving (every name it is asked for answers within the bound of its buckets having leaders
// again, as for a killed node) and the names it is asked for move to it, the minority side
// answers 503/504 and nothing else, and every name answers again within the bound after the heal.
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { httpClient } from "../../client/index.ts";
import {
  bucketLeader,
  leadersBack,
  replicasCurrent,
  startCluster,
  startRole,
  type NatsNode,
  type RoleProcess,
} from "../../cluster/index.ts";
import { authDirOf, bucketNames, indexStreamOf } from "../../platform/index.ts";
import { taskApi } from "../../schemas/index.ts";
import { activationIntervals, overlaps, writesOutside } from "../helpers/activations.ts";
import { lifo } from "../helpers/defer.ts";
import { NATS_NODE_BOUND_MS } from "../helpers/fault-bounds.ts";
import { activationLog, activationLogEnv, faultTopology } from "../helpers/fault-cluster.ts";
import { skipUnlessRequired } from "../helpers/invasive.ts";
import { startLoad, statusCounts } from "../helpers/load.ts";
import { natsSource } from "../helpers/nats.ts";
import {
  assertNoStaleReads,
  failureTally,
  objectLoadBuckets,
  readsAsWritten,
  startObjectLoad,
  type Attempt,
} from "../helpers/object-load.ts";
import { connectedPort, partitions } from "../helpers/partition.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const noLocalNats = await natsSource({ private: true }).then(
  (source) => (source === "local" ? undefined : "needs a local nats-server to run a cluster"),
  () => "needs a local nats-server to run a cluster",
);

/** A cut lasts at least this, and past the majority's bound by CUT_MARGIN_MS (see partitionRound). */
const PARTITION_MS = 10_000;
const CUT_MARGIN_MS = 2_000;
const STEADY_MS = 3_000;
/** The buckets the load writes: the majority serves once each has a leader on its side. */
const loadBuckets = [...objectLoadBuckets, bucketNames.tasks];
/** Their list indexes, streams of their own that each write also needs a leader of (`INDEX_<bucket>`). */
const loadIndexes = [indexStreamOf(bucketNames.taskObjects), indexStreamOf(bucketNames.tasks)];

/**
 * The longest time one of `names` went without a 200 in [from, to): the gaps between its
 * successes, and those from `from` to its first and from its last to `to`.
 */
function longestGap(attempts: readonly Attempt[], names: readonly string[], from: number, to: number) {
  let worst = { ms: 0, name: "" };
  for (const name of names) {
    const oks = attempts.filter((a) => a.name === name && a.ok && a.at >= from && a.at < to).map((a) => a.at);
    const points = [from, ...oks, to];
    for (let i = 1; i < points.length; i++)
      if (points[i]! - points[i - 1]! > worst.ms) worst = { ms: points[i]! - points[i - 1]!, name };
  }
  return worst;
}

it("partitions - one NATS node cut off, then the node of a task-object owner: nothing acknowledged lost, the majority serves, one activation per name", {
  timeout: 360_000,
}, async (t) => {
  if (noLocalNats) return skipUnlessRequired(t, noLocalNats);
  const defer = lifo((fn) => t.after(fn));
  const baseDir = await mkdtemp(join(tmpdir(), "partition-"));
  defer(() => rm(baseDir, { recursive: true, force: true }));
  const made = partitions(baseDir);
  if (typeof made === "string") return skipUnlessRequired(t, made);
  const tool = made;
  defer(() => tool.close());
  const topology = faultTopology;
  const { events, processOf: ownerOf, onLine } = activationLog();
  const env = activationLogEnv;
  const cluster = await startCluster(topology, { baseDir, onLine, env, natsBinary: tool.binary });
  defer(() => cluster.stop());
  const nodes = cluster.nats.nodes;
  const roleEnv = { ...env, KV_REPLICAS: String(topology.replicas), NATS_AUTH_DIR: authDirOf(baseDir) };
  /** A service process connected to `node` only (the cluster's own pick one of the three at random). */
  const pinnedTo = (node: NatsNode, role: "gateway" | "actors", name: string, extraEnv: Record<string, string> = {}) =>
    startRole({
      name,
      role,
      natsUrl: node.url,
      dataDir: join(baseDir, name),
      runDir: baseDir,
      env: { ...roleEnv, ...extraEnv },
      onLine,
    });
  const gatewayPorts = { TASK_API_PORT: "0", JOB_API_PORT: "0", MICROVM_API_PORT: "0" };
  const pinned = await Promise.all(nodes.map((n) => pinnedTo(n, "gateway", `gateway-on-${n.name}`, gatewayPorts)));
  const extraActors: RoleProcess[] = [];
  defer(() => Promise.all([...pinned, ...extraActors].map((p) => p.stop())));
  defer(() => tool.heal()); // before the stops: a cut node would hold up its peers' shutdown
  const gateways = [...cluster.gateways, ...pinned];
  const urls = gateways.map((g) => `http://127.0.0.1:${g.ports!.task}`);
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

  // Most names are read back through the gateway that created them, some through the next one.
  const names = Array.from({ length: 20 }, (_, i) => `object-${i + 1}`);
  const load = startObjectLoad(names.slice(0, 16), urls, { updates: true });
  const crossLoad = startObjectLoad(names.slice(16), urls, { readElsewhere: true, updates: true });
  const tasks = startLoad(
    urls.map((url) => ({
      url: `${url}/`,
      body: () => ({ title: "partition" }),
      idOf: (a) => (a as { id: string }).id,
    })),
    urls.length,
  );
  defer(() => Promise.all([load.stop(), crossLoad.stop(), tasks.stop()]));
  const attempts = (): Attempt[] => [...load.attempts, ...crossLoad.attempts];
  const report: string[] = [];
  const say = (line: string) => (report.push(line), t.diagnostic(line));

  /**
   * Cuts `node` off until the majority has served for a while, heals, and checks both sides'
   * answers and the recovery. Resolves to when the cut began and ended.
   */
  async function partitionRound(label: string, node: NatsNode) {
    const majorityNodes = nodes.filter((n) => n !== node);
    const onMinority = (pid: number) => nodeOf(pid) === node;
    // Whichever node is cut, a pinned gateway is on the majority side; an actor process may not be.
    if (cluster.services.concat(extraActors).every((s) => s.role !== "actors" || onMinority(s.pid))) {
      extraActors.push(await pinnedTo(majorityNodes[0]!, "actors", `actors-on-${majorityNodes[0]!.name}`));
      say(`${label}: every actor process is on ${node.name}; started one on ${majorityNodes[0]!.name}`);
    }
    const services = [...gateways, ...cluster.services, ...extraActors].filter((s, i, all) => all.indexOf(s) === i);
    const minority = services.filter((s) => onMinority(s.pid)).map((s) => s.name);
    const placement = services.map((s) => `${s.name}@${nodeOf(s.pid)?.name ?? "none"}`).join(" ");
    const minorityGateways = gateways.flatMap((g, i) => (onMinority(g.pid) ? [i] : []));
    const majorityGateways = gateways.flatMap((g, i) => (onMinority(g.pid) ? [] : [i]));
    // A node back from the last round may still be catching up (measured: 2,200 entries
    // behind, 6.6 s to catch up under this load): cutting another then is a second fault, its
    // buckets' majority not whole, and their writes stop as with two nodes down. Each round
    // starts with every replica caught up, but for the writes under way: each load worker has
    // one request at a time, of at most two writes (a fence and a record), and each actor
    // process renews its leases.
    const inFlight = 2 * (names.length + urls.length) + cluster.services.length + extraActors.length;
    const replicas = await replicasCurrent(cluster.nats.url, loadBuckets, {
      credentials: cluster.credentials.gateway,
      inFlight,
    });
    say(
      `${label}: every replica caught up ${replicas.waitedMs} ms after the round began (${Object.entries(replicas.first)
        .map(([b, line]) => `${b}: ${line}`)
        .join("; ")})`,
    );
    const cutAt = Date.now();
    tool.cut(node.name, node.routePort, routePorts);
    say(`${label}: cut ${node.name} off with ${minority.join(", ")} on its side (${placement})`);
    // The majority's part is JetStream's elections (measured), then the service's (bounded as
    // for a killed node); the cut lasts past that bound, so a total outage cannot pass.
    const ledMs = await leadersBack(
      majorityNodes.map((n) => n.url).join(","),
      loadBuckets,
      node.name,
      cluster.credentials.provision,
      cutAt,
      undefined,
      loadIndexes,
    );
    const majorityBoundMs = ledMs + NATS_NODE_BOUND_MS;
    await sleep(cutAt + Math.max(PARTITION_MS, majorityBoundMs + CUT_MARGIN_MS) - Date.now());
    tool.heal();
    const healedAt = Date.now();
    // The healed node's part is its routes and JetStream coming back (measured: through that
    // node, every bucket led by another, as the majority elected), then the service's,
    // bounded as for a killed node.
    const rejoined = leadersBack(
      node.url,
      loadBuckets,
      node.name,
      cluster.credentials.provision,
      healedAt,
      undefined,
      loadIndexes,
    );
    // Awaited below; if an assertion before that fails, its rejection is not an unhandled one.
    rejoined.catch(() => undefined);
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
    // Names whose workers use only the majority's gateways: they are served during the cut.
    const majorityNames = names.filter((n) =>
      attempts().every((a) => a.name !== n || majorityGateways.includes(a.via)),
    );
    const majorityOutage = longestGap(attempts(), majorityNames, cutAt, healedAt);
    const majorityTasks = majorityGateways.map(
      (i) => tasks.answers.filter((a) => a.target === i && a.status === 200 && a.at >= cutAt && a.at < healedAt).length,
    );
    say(
      `${label}: ${loadBuckets.join(", ")} led on the majority side ${ledMs} ms after the cut, which lasted ` +
        `${healedAt - cutAt} ms; ` +
        `through the majority's gateways the longest time one of ${majorityNames.length} names went without a 200 ` +
        `during the cut: ${majorityOutage.ms} ms (${majorityOutage.name}, bound ${majorityBoundMs} ms); ` +
        `task creates answered 200 there during the cut: ${majorityTasks.join(", ")}; ` +
        `every name and task create answered 200 again ${recoveredMs} ms after the heal; ` +
        `failed attempts: ${failureTally(during, cutAt)}; task creates: ` +
        `${JSON.stringify(statusCounts(tasks.answers.filter((a) => a.at >= cutAt)))}`,
    );
    if (majorityOutage.ms > majorityBoundMs) {
      // What that name saw, to tell JetStream's part from the service's (ms from the cut).
      const of = majorityOutage.name;
      say(
        `${of}: ` +
          attempts()
            .filter((a) => a.name === of && a.at >= cutAt - 1_000 && a.at < healedAt + 1_000)
            .map((a) => `${a.at - cutAt}:${a.kind}:${a.via}:${a.outcome}`)
            .join(" ") +
          `; activations: ${events
            .filter((e) => e.name === of && e.event !== "write" && e.at >= cutAt - 60_000)
            .map((e) => `${e.process}:${e.event}@${e.at - cutAt}${e.reason ? `:${e.reason}` : ""}`)
            .join(" ")}`,
      );
    }
    assert.ok(majorityNames.length > 0, `${label}: some names are asked for through the majority's gateways only`);
    assert.ok(
      majorityOutage.ms <= majorityBoundMs,
      `${label}: through the majority's gateways ${majorityOutage.name} went ${majorityOutage.ms} ms without a 200 ` +
        `during the cut (bound ${majorityBoundMs} ms: ${ledMs} ms to leaders + ${NATS_NODE_BOUND_MS} ms)`,
    );
    // What each majority gateway's task creates answered during the cut, and how long the longest took.
    const majorityTaskAnswers = majorityGateways.map((i) => {
      const answers = tasks.answers.filter((a) => a.target === i && a.at >= cutAt && a.at < healedAt);
      const longest = Math.max(0, ...answers.map((a) => a.ms));
      // A create sent before the cut and answered after it held its worker meanwhile.
      const spanning = tasks.answers.find((a) => a.target === i && a.at < cutAt && a.at + a.ms >= cutAt);
      const held = spanning ? `, one sent before the cut answered ${spanning.status} after ${spanning.ms} ms` : "";
      return `${gateways[i]!.name}: ${JSON.stringify(statusCounts(answers))}, longest ${longest} ms${held}`;
    });
    assert.ok(
      majorityTasks.every((n) => n > 0),
      `${label}: every majority gateway answered task creates during the cut (${majorityTasks.join(", ")}; ` +
        `${majorityTaskAnswers.join("; ")}; ` +
        `leaders ${ledMs} ms after the cut, which lasted ${healedAt - cutAt} ms; ${placement})`,
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
    const rejoinedMs = await rejoined;
    const healBoundMs = rejoinedMs + NATS_NODE_BOUND_MS;
    say(`${label}: ${node.name} saw every bucket led again ${rejoinedMs} ms after the heal`);
    assert.ok(
      recoveredMs <= healBoundMs,
      `${label}: answering again ${recoveredMs} ms after the heal (bound ${healBoundMs} ms: rejoined ${rejoinedMs} ` +
        `+ ${NATS_NODE_BOUND_MS})`,
    );
    return { cutAt, healedAt, majorityNames };
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
  const ownerProcess = [...cluster.services, ...extraActors].find((s) => s.name === ownerOf.get(owner))!;
  const ownerNode = nodeOf(ownerProcess.pid);
  assert.ok(ownerNode, `${ownerProcess.name} is connected to a node`);
  const heldBefore = open.filter((i) => i.owner === owner).map((i) => i.name);
  const cut = await partitionRound(`owner's node (${ownerProcess.name}, ${heldBefore.length} names)`, ownerNode);
  // A name asked for through the majority's gateways moves there during the cut; one asked for
  // only on the owner's side has no request reaching the majority until the heal.
  const movedDuringCut = (name: string) =>
    events.some(
      (e) => e.name === name && e.event === "start" && e.owner !== owner && e.at > cut.cutAt && e.at < cut.healedAt,
    );
  const mustMove = heldBefore.filter((name) => cut.majorityNames.includes(name));
  say(
    `${ownerProcess.name} held ${heldBefore.length} names; of the ${mustMove.length} asked for through the ` +
      `majority's gateways, ${mustMove.filter(movedDuringCut).length} were activated on the majority side during ` +
      `the cut (of the others: ${heldBefore.filter((n) => !mustMove.includes(n) && movedDuringCut(n)).length})`,
  );
  assert.deepEqual(
    mustMove.filter((name) => !movedDuringCut(name)),
    [],
    "names asked for on the majority side moved there during the cut",
  );
  await sleep(STEADY_MS);
  await Promise.all([load.stop(), crossLoad.stop(), tasks.stop()]);

  // No read of an acknowledged create answered 404 at any time; every one reads back through
  // the cluster's two gateways.
  assertNoStaleReads(attempts(), say);
  const clusterUrls = urls.slice(0, cluster.gateways.length);
  const clients = clusterUrls.map((url) => httpClient(taskApi, url));
  const writes = [...load.answered, ...crossLoad.answered];
  for (const write of writes) {
    for (const client of clients) {
      const task = await client.getTaskDO({ id: write.id, name: write.name });
      assert.ok(readsAsWritten(write, task), `${JSON.stringify(task)} for ${JSON.stringify(write)}`);
    }
  }
  const taskWrites = tasks.answers.filter((a) => a.status === 200);
  for (const write of taskWrites) {
    for (const url of clusterUrls)
      assert.equal((await fetch(`${url}/${write.id}`)).status, 200, `task ${write.id} reads back`);
  }
  await sleep(500); // the last log lines
  const intervals = activationIntervals(events);
  assert.deepEqual(overlaps(intervals), []);
  assert.deepEqual(writesOutside(intervals, events), []);
  say(
    `${writes.length} task-object creates (${writes.filter((w) => w.updated).length} updated) and ` +
      `${taskWrites.length} task creates answered 200, all read back through the cluster's two gateways; ` +
      `${intervals.length} activations, no overlap`,
  );
});

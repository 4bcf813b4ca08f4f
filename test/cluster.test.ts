// The scale-out topology: three JetStream nodes with R3 buckets keep the service answering
// when one node is killed; compose.yaml describes the same topology, and its NATS command
// lines form a cluster (compose itself cannot run here: no Docker engine).
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { parse } from "yaml";
import { bucketLeader, defaultTopology, gatewayPorts, startCluster, type Topology } from "../cluster/index.ts";
import { ClientError, httpClient, natsClient } from "../client/index.ts";
import { freePort } from "../platform/index.ts";
import { jobApi, taskApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { natsSource } from "./helpers/nats.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** These tests run nats-server processes themselves (a cluster); a container cannot stand in. */
const noLocalNats = await natsSource({ private: true }).then(
  (source) => (source === "local" ? undefined : "needs nats-server on PATH to run a cluster"),
  () => "needs nats-server on PATH to run a cluster",
);

/** Repeats `call` until it succeeds; the failures it saw on the way (by `_tag`). */
async function untilOk<T>(call: () => Promise<T>, timeoutMs: number): Promise<{ value: T; failures: string[] }> {
  const deadline = Date.now() + timeoutMs;
  const failures: string[] = [];
  for (;;) {
    try {
      return { value: await call(), failures };
    } catch (err) {
      failures.push(err instanceof ClientError ? err._tag : String(err));
      if (Date.now() > deadline) throw new Error(`still failing after ${timeoutMs} ms: ${failures.join(", ")}`);
      await sleep(100);
    }
  }
}

/** `3 × ServiceUnavailable, 1 × GatewayTimeout`, or "no failure". */
function tally(failures: string[]): string {
  const counts = new Map<string, number>();
  for (const f of failures) counts.set(f, (counts.get(f) ?? 0) + 1);
  return [...counts].map(([tag, n]) => `${n} × ${tag}`).join(", ") || "no failure";
}

describe("cluster", () => {
  it("cluster - R3 buckets: with the tasks leader node SIGKILLed, creates and reads still answer 200", { skip: noLocalNats }, async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const baseDir = await mkdtemp(join(tmpdir(), "cluster-test-"));
    defer(() => rm(baseDir, { recursive: true, force: true }));
    // Three NATS nodes as in `npm run cluster`, but one gateway and one actor process (2 cores).
    const topology: Topology = {
      ...defaultTopology,
      nats: defaultTopology.nats.map((n) => ({ ...n, port: 0, routePort: 0 })),
      gateways: [{ name: "gateway-1", ports: gatewayPorts(0) }],
      actors: ["actors-1"],
      microvmHosts: [],
    };
    // No read cache in the gateway: every read below comes from the KV replicas.
    const cluster = await startCluster(topology, { baseDir, env: { READ_CACHE_ENTRIES: "0" } });
    defer(() => cluster.stop());
    t.diagnostic(`JetStream meta leader after ${cluster.jetStreamReadyMs} ms`);
    const gateway = cluster.gateways[0].ports!;
    const tasks = httpClient(taskApi, `http://127.0.0.1:${gateway.task}`);
    const jobs = httpClient(jobApi, `http://127.0.0.1:${gateway.job}`);

    const before = await Promise.all([1, 2, 3, 4, 5].map((i) => tasks.createTask({ title: `before ${i}` })));
    const beforeDO = await tasks.createTaskDO({ title: "before, in an object", name: "team" });
    const beforeJobs = await Promise.all([1, 2, 3].map((i) => jobs.createJob({ content: `before ${i}` })));

    const leader = await bucketLeader(cluster.nats.url, "tasks");
    const victim = cluster.nats.nodes.find((n) => n.name === leader);
    assert.ok(victim, `tasks leader ${leader} is one of the nodes`);
    const killedAt = Date.now();
    await victim.kill();

    // While the bucket elects a new leader, answers are 503/504; the first create retries with
    // one Idempotency-Key, so it makes one task however often it is sent.
    const key = crypto.randomUUID();
    const first = await untilOk(() => tasks.createTask({ title: "after the kill" }, { idempotencyKey: key }), 20_000);
    const recoveryMs = Date.now() - killedAt;
    t.diagnostic(`first create 200 after ${recoveryMs} ms; before that ${tally(first.failures)}`);
    assert.ok(recoveryMs < 15_000, `creates answered again after ${recoveryMs} ms`);
    await untilOk(() => tasks.createTaskDO({ title: "after, in an object", name: "team" }), 10_000);
    await untilOk(() => jobs.createJob({ content: "after" }), 10_000);

    // Now every create and read answers at once, with no retry.
    const steadyStart = Date.now();
    const created = await Promise.all([
      ...[1, 2, 3, 4, 5].map((i) => tasks.createTask({ title: `steady ${i}` })),
      ...[1, 2, 3].map((i) => tasks.createTaskDO({ title: `steady ${i}`, name: "team" })),
      ...[1, 2, 3].map((i) => jobs.createJob({ content: `steady ${i}` })),
    ]);
    assert.equal(created.length, 11);
    for (const task of [...before, first.value]) assert.deepEqual(await tasks.getTask({ id: task.id }), task);
    assert.deepEqual(await tasks.getTaskDO({ id: beforeDO.id, name: "team" }), beforeDO);
    for (const [i, id] of beforeJobs.entries()) assert.deepEqual(await jobs.getJob({ jobId: id }), { id, content: `before ${i + 1}` });
    t.diagnostic(`11 creates and 10 reads on two nodes in ${Date.now() - steadyStart} ms`);

    // The node comes back on its store and catches up; it then serves on its own.
    await victim.start();
    const nc = await connect({ servers: victim.url, name: "test:restarted-node" });
    defer(() => nc.close());
    const kv = await new Kvm(nc).open("tasks");
    const caughtUp = await untilOk(async () => {
      const replicas = (await kv.status()).streamInfo.cluster?.replicas ?? [];
      const back = replicas.find((r) => r.name === victim.name);
      if (!back?.current || back.offline) throw new Error(`${victim.name} not current yet`);
      return replicas;
    }, 20_000);
    assert.equal(caughtUp.value.length, 2, "a leader and two current replicas again");
    const direct = natsClient(taskApi, nc);
    assert.deepEqual(await direct.getTask({ id: first.value.id }), first.value);
    const late = await direct.createTask({ title: "through the restarted node" });
    assert.deepEqual(await tasks.getTask({ id: late.id }), late);
  });

  it("compose - three routed JetStream nodes, two gateways, two actor processes, a microVM host, R3", async () => {
    const compose = parse(await readFile(join(root, "compose.yaml"), "utf8"), { merge: true }) as ComposeFile;
    const services = compose.services;
    const expected = [
      ...defaultTopology.nats.map((n) => n.name),
      ...defaultTopology.gateways.map((g) => g.name),
      ...defaultTopology.actors,
      ...defaultTopology.microvmHosts,
    ];
    assert.deepEqual(Object.keys(services).sort(), expected.sort());

    const natsNames = defaultTopology.nats.map((n) => n.name);
    const natsUrl = natsNames.map((n) => `nats://${n}:4222`).join(",");
    for (const [i, node] of defaultTopology.nats.entries()) {
      const s = services[node.name];
      const args = flags(s.command!);
      assert.equal(s.command![0], "nats-server");
      assert.ok("--jetstream" in args, `${node.name} runs JetStream`);
      assert.equal(args["--server_name"], node.name);
      assert.equal(args["--cluster_name"], defaultTopology.clusterName);
      const peers = natsNames.filter((n) => n !== node.name).map((n) => `nats://${n}:6222`);
      assert.deepEqual(args["--routes"].split(","), peers);
      assert.deepEqual(s.volumes, [`${node.name}-data:${args["--store_dir"]}`], "an own store volume");
      assert.deepEqual(s.ports, [`${defaultTopology.nats[i].port}:4222`], "the client port of `npm run cluster`");
      assert.ok(s.healthcheck?.test.join(" ").includes(`:${args["--http_port"]}/healthz`));
    }
    const roleOf = (s: ComposeService) => s.command!.slice(s.command!.indexOf("--role") + 1)[0];
    for (const name of [...defaultTopology.gateways.map((g) => g.name), ...defaultTopology.actors, ...defaultTopology.microvmHosts]) {
      const s = services[name];
      assert.equal(s.environment?.NATS_URL, natsUrl, `${name} lists every node`);
      assert.equal(s.environment?.KV_REPLICAS, String(defaultTopology.replicas));
      assert.deepEqual(Object.keys(s.depends_on ?? {}).sort(), natsNames);
      assert.equal(s.build?.dockerfile, "cluster/Dockerfile");
    }
    for (const g of defaultTopology.gateways) {
      const s = services[g.name];
      assert.equal(roleOf(s), "gateway");
      assert.equal(s.environment?.HOST, "0.0.0.0");
      assert.deepEqual(s.ports, [`${g.ports.task}:8787`, `${g.ports.job}:8788`, `${g.ports.microvm}:8789`]);
    }
    for (const name of defaultTopology.actors) assert.equal(roleOf(services[name]), "actors");
    for (const name of defaultTopology.microvmHosts) {
      assert.equal(roleOf(services[name]), "microvms");
      assert.equal(services[name].environment?.MICROVM_HOST_ID, name);
    }
    const volumes = Object.values(services).flatMap((s) => (s.volumes ?? []).map((v) => v.split(":")[0]));
    assert.deepEqual(Object.keys(compose.volumes).sort(), [...new Set(volumes)].sort());
    await readFile(join(root, "cluster/Dockerfile"), "utf8");
  });

  it("compose - the NATS nodes' command lines form a JetStream cluster (run locally on loopback)", { skip: noLocalNats }, async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const compose = parse(await readFile(join(root, "compose.yaml"), "utf8"), { merge: true }) as ComposeFile;
    const names = defaultTopology.nats.map((n) => n.name);
    const ports = Object.fromEntries(await Promise.all(names.map(async (n) => [n, { client: await freePort(), route: await freePort(), http: await freePort() }] as const)));
    const nodes: { name: string; child: ChildProcess; http: number }[] = [];
    for (const name of names) {
      const store = await mkdtemp(join(tmpdir(), `compose-${name}-`));
      defer(() => rm(store, { recursive: true, force: true }));
      // The container's command with loopback addresses: service names become 127.0.0.1 ports.
      const args = compose.services[name].command!.slice(1).map((arg, i, all) => {
        const flag = all[i - 1];
        if (flag === "--store_dir") return store;
        if (flag === "--port") return String(ports[name].client);
        if (flag === "--http_port") return String(ports[name].http);
        if (flag === "--cluster") return `nats://127.0.0.1:${ports[name].route}`;
        if (flag === "--routes") return arg.replace(/nats:\/\/(nats-\d):6222/g, (_, peer: string) => `nats://127.0.0.1:${ports[peer].route}`);
        return arg;
      });
      const child = spawn("nats-server", [...args, "--addr", "127.0.0.1"], { stdio: ["ignore", "ignore", "pipe"] });
      const exited = once(child, "exit");
      defer(async () => {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
        await exited;
      });
      let log = "";
      child.stderr!.on("data", (d) => (log = (log + d).slice(-4000)));
      await untilOk(async () => {
        if (child.exitCode !== null) throw new Error(`${name} exited: ${log}`);
        if (!log.includes("Server is ready")) throw new Error("not ready");
      }, 10_000).catch((err) => assert.fail(`${name}: ${(err as Error).message}\n${log}`));
      nodes.push({ name, child, http: ports[name].http });
    }
    // The compose healthcheck: /healthz answers 200 once JetStream has a meta leader.
    for (const node of nodes) {
      await untilOk(async () => {
        const res = await fetch(`http://127.0.0.1:${node.http}/healthz`);
        if (!res.ok) throw new Error(`${node.name} healthz ${res.status}`);
      }, 20_000);
      const routez = (await (await fetch(`http://127.0.0.1:${node.http}/routez`)).json()) as { num_routes: number };
      assert.ok(routez.num_routes >= 2, `${node.name} routes to both peers`);
    }
  });
});

interface ComposeService {
  command?: string[];
  environment?: Record<string, string>;
  ports?: string[];
  volumes?: string[];
  depends_on?: Record<string, unknown>;
  build?: { context: string; dockerfile: string };
  healthcheck?: { test: string[] };
}

interface ComposeFile {
  services: Record<string, ComposeService>;
  volumes: Record<string, unknown>;
}

/** `--flag value` pairs of a command line (a flag followed by another flag maps to ""). */
function flags(command: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  command.forEach((arg, i) => {
    if (arg.startsWith("-")) out[arg] = command[i + 1]?.startsWith("-") ? "" : (command[i + 1] ?? "");
  });
  return out;
}

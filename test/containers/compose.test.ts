// compose.yaml in Docker, as written (images built by scripts/build-images.sh): three JetStream
// nodes with R3 buckets, two gateways, two actor processes and a microVM host. Requests through
// both gateways; a sandboxed microVM answers; one actor container and one NATS container are
// SIGKILLed under task-object load with the fault bounds of the local-process cluster; then
// `docker compose down -v` leaves nothing. Run by `npm run test:containers`.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { ActivationEvent } from "../../actors/index.ts";
import { bucketLeader, leadersBack } from "../../cluster/index.ts";
import { type ClientError, httpClient } from "../../client/index.ts";
import { bucketNames } from "../../platform/index.ts";
import { jobApi, microvmApi, taskApi } from "../../schemas/index.ts";
import { activationIntervals, overlaps, writesOutside } from "../helpers/activations.ts";
import { composeProject, docker, type ComposeProject } from "../helpers/compose.ts";
import { FAILOVER_BOUND_MS, NATS_NODE_BOUND_MS } from "../helpers/fault-bounds.ts";
import { dockerEngine } from "../helpers/nats.ts";
import { assertNoStaleReads, objectLoadBuckets, recoveryAfter, startObjectLoad } from "../helpers/object-load.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const noEngine = (await dockerEngine()) ? undefined : "needs a Docker engine (npm run test:containers starts one)";
const STEADY_MS = 3_000;

/** Activation events an actor container has logged (every run of it), by its debug lines. */
async function activationEvents(project: ComposeProject, service: string): Promise<ActivationEvent[]> {
  const logs = await docker("logs", await project.container(service));
  return logs
    .split("\n")
    .filter((line) => line.includes('"activation"'))
    .map((line) => (JSON.parse(line) as { activation: ActivationEvent }).activation);
}

/** The gateway's NATS login (it may read bucket status). */
const gatewayLogin = (project: ComposeProject) => ({
  user: "gateway",
  pass: project.passwords.NATS_GATEWAY_PASSWORD,
  inboxPrefix: "_INBOX_gateway",
});

/** The NATS nodes whose container health is `unhealthy`. */
async function unhealthyNatsNodes(project: ComposeProject): Promise<string[]> {
  const states = await Promise.all(
    ["nats-1", "nats-2", "nats-3"].map(async (node) => {
      const id = await project.container(node).catch(() => "");
      const health = id ? await docker("inspect", "--format", "{{.State.Health.Status}}", id).catch(() => "") : "";
      return health.trim() === "unhealthy" ? node : undefined;
    }),
  );
  return states.filter((node) => node !== undefined);
}

describe("compose", { skip: noEngine, timeout: 600_000 }, () => {
  let project: ComposeProject;
  let down = false;

  before(async () => {
    // Debug lines carry every activation and write: the single-activation audit below.
    project = await composeProject(`typed-service-test-${process.pid}`, {
      LOG_LEVEL: "debug",
      TASK_OBJECT_LOG_WRITES: "1",
    });
    const started = Date.now();
    // Two nodes that dial each other at once can go seconds without a meta leader
    // (docs/deployment.md; on nats-server 2.10 sometimes for good): should `up` fail on an
    // unhealthy node, the test does what the docs tell users to do, restarts one stuck node and
    // runs `up` again, and says so; a restart can meet the same race, so the unhealthy nodes are
    // restarted in turn (seen on 2.10 under a CPU hog: nats-2 restarted twice while nats-1 stayed
    // without a meta leader).
    // Any other failure of `up` is printed with the containers' state and last log lines, and
    // the project is taken down and brought up once more; a second such failure fails the suite.
    for (let restarts = 0, fresh = 0; ; restarts++) {
      const failed = await project.compose("up", "--detach", "--no-build", "--pull", "never", "--wait").then(
        () => undefined,
        (err: Error) => err,
      );
      if (!failed) break;
      const unhealthy = await unhealthyNatsNodes(project);
      if (restarts < 4 && unhealthy.length > 0) {
        const node = unhealthy.at(-1 - (restarts % unhealthy.length))!;
        console.log(`# compose up: ${unhealthy.join(", ")} unhealthy (no meta leader); restarting ${node}`);
        await project.compose("restart", node);
        continue;
      }
      const state = await project.compose("ps", "--all").catch(() => "");
      const logs = await project.compose("logs", "--no-color", "--tail", "5").catch(() => "");
      const why = `${failed.message.split("\n").slice(-3).join("\n")}\n${state}\n${logs}`;
      if (fresh++ === 0) {
        console.log(`# compose up failed; down -v and up again:\n${why.replace(/^/gm, "#   ")}`);
        await project.compose("down", "--volumes", "--remove-orphans", "--timeout", "5");
        continue;
      }
      throw new Error(why);
    }
    console.log(`# compose up --wait: ${Date.now() - started} ms`);
  });
  after(async () => {
    if (!down) await project?.down();
  });

  it("compose - requests through both gateways reach the same R3 buckets", async () => {
    const jsz = JSON.parse(
      await docker("exec", await project.container("nats-1"), "wget", "-qO-", "http://127.0.0.1:8222/jsz"),
    ) as { meta_cluster: { cluster_size: number } };
    assert.equal(jsz.meta_cluster.cluster_size, 3, "all three nodes are in the JetStream meta group");
    const clients = (g: ComposeProject["gateways"][number]) => ({
      tasks: httpClient(taskApi, g.task, { apiKey: project.apiKey }),
      jobs: httpClient(jobApi, g.job, { apiKey: project.apiKey }),
    });
    const [one, two] = [clients(project.gateways[0]!), clients(project.gateways[1]!)];
    const task = await one.tasks.createTask({ title: "through gateway-1" });
    assert.deepEqual(await two.tasks.getTask({ id: task.id }), task);
    const inObject = await two.tasks.createTaskDO({ title: "in an object, through gateway-2", name: "compose" });
    assert.deepEqual(await one.tasks.getTaskDO({ id: inObject.id, name: "compose" }), inObject);
    const jobId = await two.jobs.createJob({ content: "a job" });
    assert.deepEqual(await one.jobs.getJob({ jobId }), { id: jobId, content: "a job" });
    const anonymous = httpClient(taskApi, project.gateways[0]!.task);
    await assert.rejects(anonymous.createTask({ title: "no key" }), (err: ClientError) => err.status === 401);
    const leader = await bucketLeader(project.nats["nats-1"]!, bucketNames.tasks, gatewayLogin(project));
    assert.match(leader ?? "", /^nats-[123]$/, "the tasks bucket has a leader among the three nodes");
  });

  it("compose - the microVM host runs a sandboxed instance that answers through its proxy", async () => {
    const api = httpClient(microvmApi, project.gateways[0]!.microvm, { apiKey: project.apiKey });
    const idlePolicy = { maxIdleDurationSeconds: 60, suspendedDurationSeconds: 60, autoResumeEnabled: true };
    const { microvmId, endpoint } = await api.runMicrovm({ imageIdentifier: "sandbox", idlePolicy });
    try {
      let state = "";
      for (const deadline = Date.now() + 30_000; state !== "RUNNING"; await sleep(250)) {
        state = (await api.getMicrovm({ microvmIdentifier: microvmId })).state;
        assert.ok(state === "PENDING" || state === "RUNNING", `state ${state}`);
        assert.ok(Date.now() < deadline, "RUNNING within 30 s");
      }
      const { authToken } = await api.createAuthToken({
        microvmIdentifier: microvmId,
        expirationInMinutes: 5,
        allowedPorts: [{ port: 8080 }],
      });
      // The endpoint (microvm-host-1:<port>) is reachable on the compose network only: call it
      // from the gateway's container, as another service there would.
      const call =
        `fetch("http://${endpoint}/__rpc__/hello", { method: "POST", headers: { "x-aws-proxy-auth": ` +
        `process.env.TOKEN }, body: '["compose"]' })` +
        ".then(async (r) => { console.log(r.status, await r.text()); })";
      const gateway = await project.container("gateway-2");
      const answer = await docker(
        "exec",
        "--env",
        `TOKEN=${authToken["X-aws-proxy-auth"]}`,
        gateway,
        "node",
        "-e",
        call,
      );
      assert.equal(answer.trim(), '200 "hello, compose!"');
      const forged = await docker("exec", "--env", "TOKEN=forged", gateway, "node", "-e", call);
      assert.match(forged.trim(), /^403 /);
    } finally {
      await api.terminateMicrovm({ microvmIdentifier: microvmId });
    }
  });

  it("compose - an actor container and a NATS container SIGKILLed under load: no acknowledged write lost, one activation per name", async (t) => {
    const names = Array.from({ length: 12 }, (_, i) => `object-${i + 1}`);
    const load = startObjectLoad(
      names,
      project.gateways.map((g) => g.task),
      { apiKey: project.apiKey },
    );
    t.after(() => load.stop());
    const diedAt: Record<string, number> = {};
    await sleep(STEADY_MS);
    assert.ok(load.answered.length > 12, `steady load answered ${load.answered.length} creates`);

    // 1. SIGKILL the actor container whose process holds the most names; start it again.
    const held = async (service: string) => {
      const events = await activationEvents(project, service);
      const open = activationIntervals(events).filter((i) => i.end === undefined && diedAt[i.owner] === undefined);
      return { service, owners: [...new Set(events.map((e) => e.owner))], held: open.length };
    };
    const [busiest] = (await Promise.all(["actors-1", "actors-2"].map(held))).sort((a, b) => b.held - a.held);
    const killedAt = Date.now();
    await project.compose("kill", "--signal", "SIGKILL", busiest!.service);
    // Dead once the kill has returned (the request takes a few hundred ms to reach it).
    const deadAt = Date.now();
    for (const owner of busiest!.owners) diedAt[owner] = deadAt;
    const actorOutage = await recoveryAfter(load, names, killedAt, FAILOVER_BOUND_MS);
    t.diagnostic(
      `SIGKILL ${busiest!.service} holding ${busiest!.held} names: longest time a name went without a 200: ` +
        `${actorOutage.ms} ms (${actorOutage.name}); failed attempts: ${actorOutage.failures}`,
    );
    assert.ok(
      actorOutage.ms <= FAILOVER_BOUND_MS,
      `a name was unanswered for ${actorOutage.ms} ms (bound ${FAILOVER_BOUND_MS} ms)`,
    );
    await project.compose("start", busiest!.service);
    await sleep(STEADY_MS);

    // 2. SIGKILL the NATS container leading the lease bucket; start it again.
    const leader = await bucketLeader(
      Object.values(project.nats).join(","),
      bucketNames.taskObjectLeases,
      gatewayLogin(project),
    );
    assert.match(leader ?? "", /^nats-[123]$/, "the lease bucket's leader is a compose node");
    const natsKilledAt = Date.now();
    await project.compose("kill", "--signal", "SIGKILL", leader!);
    // JetStream's part (the Raft elections) is measured; the service's part is bounded after it,
    // as in test/faults/placement-cluster.test.ts: every name answers 200 again within the bound
    // of its buckets having leaders again.
    const natsUrls = Object.values(project.nats).join(",");
    const ledMs = await leadersBack(natsUrls, objectLoadBuckets, leader!, gatewayLogin(project), natsKilledAt);
    const natsOutage = await recoveryAfter(load, names, natsKilledAt, ledMs + NATS_NODE_BOUND_MS);
    t.diagnostic(
      `SIGKILL ${leader} (leader of ${bucketNames.taskObjectLeases}): ${objectLoadBuckets.join(" and ")} led again ` +
        `after ${ledMs} ms; longest time a name went without a 200: ${natsOutage.ms} ms (${natsOutage.name}); ` +
        `failed attempts: ${natsOutage.failures}`,
    );
    assert.ok(
      natsOutage.ms <= ledMs + NATS_NODE_BOUND_MS,
      `a name was unanswered for ${natsOutage.ms} ms, the buckets led again after ${ledMs} ms (bound ` +
        `${NATS_NODE_BOUND_MS} ms after)`,
    );
    await project.compose("start", leader!);
    await sleep(STEADY_MS);
    await load.stop();

    // No read of an acknowledged create answered 404 during the kills (the load retries until
    // 200, so a stale read is only seen here), and every one reads back now, through both gateways.
    assertNoStaleReads(load.attempts, (line) => t.diagnostic(line));
    const clients = project.gateways.map((g) => httpClient(taskApi, g.task, { apiKey: project.apiKey }));
    for (const [i, write] of load.answered.entries()) {
      assert.deepEqual(await clients[i % 2]!.getTaskDO({ id: write.id, name: write.name }), {
        id: write.id,
        title: write.title,
        completed: false,
      });
    }
    // Activations of a name never overlapped; writes left only inside their activation.
    await sleep(500);
    const events = (await Promise.all(["actors-1", "actors-2"].map((s) => activationEvents(project, s)))).flat();
    const intervals = activationIntervals(events);
    const problems = [...overlaps(intervals, diedAt), ...writesOutside(intervals, events, diedAt)];
    if (problems.length > 0) {
      const name = problems[0]!.split(":")[0];
      t.diagnostic(`actor SIGKILL at ${killedAt}, NATS SIGKILL at ${natsKilledAt}; died: ${JSON.stringify(diedAt)}`);
      t.diagnostic(
        `${name}: ` +
          events
            .filter((e) => e.name === name)
            .map((e) => `${e.owner}@${e.revision} ${e.event} ${e.at}${e.reason ? ` ${e.reason}` : ""}`)
            .join("; "),
      );
    }
    assert.deepEqual(overlaps(intervals, diedAt), []);
    assert.deepEqual(writesOutside(intervals, events, diedAt), []);
    t.diagnostic(
      `${load.answered.length} creates answered 200, all read back; ${intervals.length} activations, ` +
        `${events.filter((e) => e.event === "write").length} writes, no overlap`,
    );
  });

  it("compose - down -v leaves no container, network or volume of the project", async () => {
    down = true;
    await project.down();
    assert.deepEqual(await project.leftovers(), []);
  });
});

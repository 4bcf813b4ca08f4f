// NATS micro discovery: two actor processes and a microVM host register as services, and the
// reference client (@nats-io/services), as the `internal` user, finds every operation there.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Svcm, type ServiceClient, type ServiceIdentity, type ServiceInfo, type ServiceStats } from "@nats-io/services";
import { startActors, type ActorsHandle } from "../actors/index.ts";
import { provisionMicrovmStores, startMicrovmHost } from "../vm-runtime/service/index.ts";
import { connectNats, openBuckets, provisionBuckets, recordStores, type NatsHandle } from "../platform/index.ts";
import {
  inputSchema,
  jobApi,
  microvmApi,
  serviceNames,
  subscriptionSubject,
  viaGateway,
  taskApi,
  type Operation,
} from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";

/** Every answer to one discovery request (the client stops after a quiet spell). */
async function all<T>(answers: Promise<AsyncIterable<T>>): Promise<T[]> {
  const list: T[] = [];
  for await (const answer of await answers) list.push(answer);
  return list;
}

const json = (value: unknown) => JSON.parse(JSON.stringify(value)) as unknown;

describe("discovery", () => {
  const defer = lifo(after);
  let nats: TestNats;
  let internal: NatsHandle;
  let client: ServiceClient;
  const actors: ActorsHandle[] = [];

  const startActorProcess = async () => {
    const handle = await connectNats({ ...nats.login("actors"), name: "test:actors" });
    defer(() => handle.close());
    const started = startActors(handle.nc, recordStores(handle.requester), {
      publisher: handle.publisher,
      requester: handle.requester,
    });
    defer(() => started.close());
    await handle.nc.flush();
    return started;
  };

  before(async () => {
    nats = await testNats(defer);
    const admin = await connectNats({ ...nats.login("admin"), name: "test" });
    defer(() => admin.close());
    await provisionBuckets(admin.nc);
    await provisionMicrovmStores(admin.nc);
    actors.push(await startActorProcess(), await startActorProcess());
    const hostNats = await connectNats({ ...nats.login("microvms"), name: "test:microvms" });
    defer(() => hostNats.close());
    const { microvms } = await openBuckets(hostNats.nc, { only: ["microvms"] });
    const dataDir = await mkdtemp(join(tmpdir(), "discovery-host-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const host = await startMicrovmHost(hostNats.nc, {
      kv: microvms,
      dataDir,
      hostId: "discovery-host",
      provider: "process",
    });
    defer(() => host.close());
    await hostNats.nc.flush();
    internal = await connectNats({ ...nats.login("internal"), name: "test:internal" });
    defer(() => internal.close());
    client = new Svcm(internal.nc).client({ strategy: "stall", maxWait: 500 });
  });

  it("discovery - PING finds each service once per process", async () => {
    const pings = await all<ServiceIdentity>(client.ping());
    const count = (name: string) => pings.filter((p) => p.name === name).length;
    assert.equal(count(serviceNames.actors), 2);
    assert.equal(count(serviceNames.microvms), 1);
    assert.equal(new Set(pings.map((p) => p.id)).size, pings.length, "every instance has its own id");
    for (const ping of pings) {
      assert.equal(ping.type, "io.nats.micro.v1.ping_response");
      assert.match(ping.version, /^\d+\.\d+\.\d+/);
      assert.equal(ping.metadata?.pid, String(process.pid));
    }
  });

  it("discovery - INFO lists every operation with its subject, queue group and schemas", async () => {
    const infos = await all<ServiceInfo>(client.info());
    assert.equal(infos.length, 3);
    const endpoint = (service: string, name: string) => {
      const found = infos.find((i) => i.name === service)?.endpoints.find((e) => e.name === name);
      assert.ok(found, `${service} lists ${name}`);
      return found;
    };
    const expect = (service: string, op: Operation, name: string, subject: string, queue?: string) => {
      const listed = endpoint(service, name);
      assert.equal(listed.subject, subject);
      if (queue !== undefined) assert.equal(listed.queue_group, queue);
      assert.equal(listed.metadata?.operation, op.name);
      assert.deepEqual(JSON.parse(listed.metadata!.request_schema!), json(inputSchema(op)));
      assert.deepEqual(JSON.parse(listed.metadata!.response_schema!), json(op.success));
      assert.equal(listed.metadata?.http, `${op.http.method} ${op.http.path}`);
    };
    expect(serviceNames.actors, taskApi.getTask, "getTask", "tasks.get", "actors.getTask");
    expect(serviceNames.actors, taskApi.createTask, "createTask", "tasks.create", "actors.createTask");
    expect(serviceNames.actors, jobApi.getJob, "getJob", "jobs.get", "actors.getJob");
    expect(serviceNames.actors, jobApi.createJob, "createJob", "jobs.create", "actors.createJob");
    expect(serviceNames.actors, taskApi.getTaskDO, "getTaskDO", "taskobjects.*.get", "actors.getTaskDO");
    expect(serviceNames.actors, taskApi.createTaskDO, "createTaskDO", "taskobjects.*.create", "actors.createTaskDO");
    expect(serviceNames.actors, taskApi.getTask, "getTask-gateway", "gateway.tasks.get", "actors.getTask");
    expect(serviceNames.actors, taskApi.listTaskObjects, "listTaskObjects-gateway", "gateway.taskobjects.list");
    assert.equal(endpoint(serviceNames.actors, "getTaskDO").metadata?.subject_template, "taskobjects.{name}.get");
    assert.match(
      endpoint(serviceNames.actors, "createTaskDO-owner").subject,
      /^taskobjects\.owner\.[\w-]+\.\*\.create$/,
    );
    for (const op of Object.values(microvmApi) as Operation[]) {
      expect(serviceNames.microvms, op, op.name, subscriptionSubject(op), `microvms.${op.name}`);
      expect(serviceNames.microvms, op, `${op.name}-gateway`, subscriptionSubject(viaGateway(op)));
    }
    expect(
      serviceNames.microvms,
      microvmApi.terminateMicrovm,
      "terminateMicrovm-host",
      endpoint(serviceNames.microvms, "terminateMicrovm-host").subject,
      "",
    );
    assert.match(
      endpoint(serviceNames.microvms, "terminateMicrovm-host").subject,
      /^microvms\.host\.[\w-]+\.terminate$/,
    );
  });

  it("discovery - STATS count requests and error replies per endpoint", async () => {
    const request = (subject: string, body: unknown) =>
      internal.nc.request(subject, JSON.stringify(body), { timeout: 5_000 });
    const before = await endpointTotals(client, serviceNames.actors);
    await request("tasks.create", { title: "counted" });
    await request("tasks.create", { title: 5 });
    await request("tasks.get", { id: "absent" });
    const now = await endpointTotals(client, serviceNames.actors);
    assert.equal(now.createTask!.num_requests - before.createTask!.num_requests, 2);
    assert.equal(now.createTask!.num_errors - before.createTask!.num_errors, 1);
    assert.equal(now.getTask!.num_requests - before.getTask!.num_requests, 1);
    assert.equal(now.getTask!.num_errors - before.getTask!.num_errors, 1);
    assert.ok(now.getTask!.last_errors.includes("404:TaskNotFound"), now.getTask!.last_errors.join());
    assert.ok(now.createTask!.last_errors.includes("400:HttpApiDecodeError"), now.createTask!.last_errors.join());
    assert.ok(
      now.createTask!.processing_time > before.createTask!.processing_time,
      "processing time is counted in nanoseconds",
    );
  });

  it("discovery - a stopped actor process leaves discovery with its instance", async () => {
    const [one] = await all<ServiceIdentity>(client.ping(serviceNames.actors));
    const own = await all<ServiceInfo>(client.info(serviceNames.actors, one!.id));
    assert.deepEqual(
      own.map((i) => i.id),
      [one!.id],
    );
    await actors.pop()!.close();
    const left = await all<ServiceIdentity>(client.ping(serviceNames.actors));
    assert.equal(left.length, 1);
  });
});

interface Totals {
  num_requests: number;
  num_errors: number;
  processing_time: number;
  last_errors: string[];
}

/** Each endpoint's counts summed over the instances of service `name`. */
async function endpointTotals(client: ServiceClient, name: string): Promise<Record<string, Totals>> {
  const totals: Record<string, Totals> = {};
  for (const stats of await all<ServiceStats>(client.stats(name))) {
    assert.equal(stats.type, "io.nats.micro.v1.stats_response");
    for (const e of stats.endpoints ?? []) {
      const t = (totals[e.name] ??= { num_requests: 0, num_errors: 0, processing_time: 0, last_errors: [] });
      assert.ok(
        Number.isInteger(e.processing_time) && Number.isInteger(e.average_processing_time),
        "nanoseconds are integers",
      );
      t.num_requests += e.num_requests;
      t.num_errors += e.num_errors;
      t.processing_time += e.processing_time;
      if (e.last_error) t.last_errors.push(e.last_error);
    }
  }
  return totals;
}

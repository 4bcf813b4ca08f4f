// The private server with the generated config: no anonymous access, each role denied outside
// its permissions (the violation seen by the client), the `internal` user able to call every
// public operation and watch jobs but not to write, and nobody able to stand in for an actor.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, headers, type NatsConnection } from "@nats-io/transport-node";
import { startActors } from "../actors/index.ts";
import { provisionMicrovmStores, startMicrovmHost } from "../vm-runtime/service/index.ts";
import { natsClient, watchJobs } from "../client/index.ts";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  actorBuckets,
  authOptions,
  connectNats,
  clientCredentials,
  credentialsFromEnv,
  ensureNatsCredentials,
  natsRoles,
  openBuckets,
  provisionBuckets,
  recordStores,
  seedFile,
  serviceStreams,
  type NatsHandle,
  OBJECT_ALARMS_STREAM,
} from "../platform/index.ts";
import { jobApi, microvmApi, PRINCIPAL_HEADER, taskApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { waitForState } from "./helpers/microvm.ts";
import { testNats, type TestNats, type TestRole } from "./helpers/nats.ts";

const defer = lifo(after);
let nats: TestNats;
let admin: NatsHandle;

before(async () => {
  nats = await testNats(defer, { private: true });
  admin = await connectNats({ ...nats.login("admin"), name: "test" });
  defer(() => admin.close());
  await provisionBuckets(admin.nc);
  await provisionMicrovmStores(admin.nc);
});

/** A raw nats.js connection as `role` (no reconnects: a refused connect fails at once). */
async function as(role: TestRole): Promise<NatsConnection> {
  const { servers, credentials } = nats.login(role);
  const nc = await connect({ servers, name: `test:${role}`, maxReconnectAttempts: 0, ...authOptions(credentials) });
  defer(() => nc.close());
  return nc;
}

/** Resolves with the server's permission violation for `subject` on `nc`; fails after 3 s. */
async function violation(
  nc: NatsConnection,
  subject: string | RegExp,
): Promise<{ operation: string; subject: string }> {
  const timeout = setTimeout(() => void nc.close(), 3_000);
  try {
    for await (const status of nc.status()) {
      if (status.type !== "error") continue;
      const err = status.error as Error & { operation?: string; subject?: string };
      if (err.name !== "PermissionViolationError") continue;
      if (typeof subject === "string" ? err.subject === subject : subject.test(err.subject!))
        return { operation: err.operation!, subject: err.subject! };
    }
  } finally {
    clearTimeout(timeout);
  }
  assert.fail(`no permission violation for ${subject}`);
}

async function refusedPublish(role: TestRole, subject: string) {
  const nc = await as(role);
  const seen = violation(nc, subject);
  nc.publish(subject, "x");
  assert.deepEqual(await seen, { operation: "publish", subject });
}

async function refusedSubscribe(role: TestRole, subject: string, queue?: string) {
  const nc = await as(role);
  const seen = violation(nc, subject);
  let received = 0;
  // The refused subscription's callback gets the violation as its error, never a message.
  nc.subscribe(subject, { ...(queue ? { queue } : {}), callback: (err) => void (err || received++) });
  assert.deepEqual(await seen, { operation: "subscription", subject });
  assert.equal(received, 0);
}

describe("nats auth - connecting", () => {
  it("nats auth - an anonymous connect is refused", async () => {
    await assert.rejects(connect({ servers: nats.url, maxReconnectAttempts: 0 }), (err: Error) =>
      /Authorization/i.test(err.message),
    );
  });

  it("nats auth - an unknown nkey is refused", async () => {
    const { createUser } = await import("@nats-io/nkeys");
    const seed = new TextDecoder().decode(createUser().getSeed());
    await assert.rejects(
      connect({ servers: nats.url, maxReconnectAttempts: 0, ...authOptions({ nkeySeed: seed }) }),
      /Authorization/i,
    );
  });

  it("nats auth - seeds are files only their owner can read", async () => {
    for (const role of natsRoles) {
      assert.equal((await stat(seedFile(nats.authDir!, role))).mode & 0o077, 0, role);
    }
    assert.equal((await stat(nats.authDir!)).mode & 0o077, 0);
  });
});

describe("nats auth - each role stays inside its permissions", () => {
  it("nats auth - the gateway cannot write a bucket", async () => {
    await refusedPublish("gateway", "$KV.tasks.forged");
  });

  it("nats auth - the actors cannot write another role's bucket", async () => {
    await refusedPublish("actors", "$KV.microvms.forged");
  });

  it("nats auth - the microVM host cannot write another role's bucket", async () => {
    await refusedPublish("microvms", "$KV.tasks.forged");
  });

  it("nats auth - no role but the host can purge a stream", async () => {
    for (const role of ["gateway", "actors", "internal"] as const) {
      const nc = await as(role);
      const seen = violation(nc, "$JS.API.STREAM.PURGE.KV_tasks");
      const jsm = await jetstreamManager(nc, { timeout: 1_000, checkAPI: false });
      await assert.rejects(jsm.streams.purge("KV_tasks"));
      await seen;
    }
    await refusedPublish("microvms", "$JS.API.STREAM.PURGE.KV_tasks");
  });

  it("nats auth - no role can subscribe to everything", async () => {
    for (const role of ["gateway", "actors", "microvms", "internal"] as const) await refusedSubscribe(role, ">");
  });

  it("nats auth - nobody but the actors can join their queue groups", async () => {
    for (const role of ["gateway", "microvms", "internal"] as const)
      await refusedSubscribe(role, "tasks.create", "actors.createTask");
  });

  it("nats auth - nobody but the hosts can subscribe to the microVM subjects", async () => {
    for (const role of ["gateway", "actors", "internal"] as const) {
      await refusedSubscribe(role, "microvms.run", "microvms.runMicrovm");
      await refusedSubscribe(role, "microvms.host.aG9zdA.token");
    }
  });

  it("nats auth - nobody reads another user's replies", async () => {
    await refusedSubscribe("internal", "_INBOX_gateway.>");
    await refusedSubscribe("gateway", "_INBOX.>");
  });

  it("nats auth - only the gateway may claim an HTTP principal", async () => {
    await refusedPublish("internal", "gateway.microvms.list");
    await refusedPublish("actors", "gateway.microvms.list");
  });
});

describe("nats auth - the service and the internal user", () => {
  let internal: NatsConnection;
  before(async () => {
    const actorsNats = await connectNats({ ...nats.login("actors"), name: "test:actors" });
    defer(() => actorsNats.close());
    await openBuckets(actorsNats.nc, { only: actorBuckets });
    const actors = startActors(actorsNats.nc, recordStores(actorsNats.requester), {
      publisher: actorsNats.publisher,
      requester: actorsNats.requester,
    });
    defer(() => actors.close());
    await actorsNats.nc.flush(); // the actors' subscriptions are known to the server before any request
    const hostNats = await connectNats({ ...nats.login("microvms"), name: "test:microvms" });
    defer(() => hostNats.close());
    const { microvms } = await openBuckets(hostNats.nc, { only: ["microvms"] });
    const dataDir = await mkdtemp(join(tmpdir(), "nats-auth-host-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const host = await startMicrovmHost(hostNats.nc, { kv: microvms, dataDir, hostId: "auth-test" });
    defer(() => host.close());
    internal = await as("internal");
  });

  it("nats auth - the internal user can call every public operation", async () => {
    const tasks = natsClient(taskApi, internal);
    const task = await tasks.createTask({ title: "from another service" });
    assert.deepEqual(await tasks.getTask({ id: task.id }), task);
    const inObject = await tasks.createTaskDO({ title: "in an object", name: "auth" });
    assert.deepEqual(await tasks.getTaskDO({ id: inObject.id, name: "auth" }), inObject);
    const jobs = natsClient(jobApi, internal);
    const jobId = await jobs.createJob({ content: "x" });
    assert.deepEqual(await jobs.getJob({ jobId }), { id: jobId, content: "x" });
    const vms = natsClient(microvmApi, internal);
    const vm = await vms.runMicrovm({
      idlePolicy: { maxIdleDurationSeconds: 600, suspendedDurationSeconds: 600, autoResumeEnabled: true },
    });
    assert.equal((await vms.getMicrovm({ microvmIdentifier: vm.microvmId })).microvmId, vm.microvmId);
    assert.deepEqual(
      (await vms.listMicrovms({})).items.map((item) => item.microvmId),
      [vm.microvmId],
    );
    await waitForState(vms, vm.microvmId, ["RUNNING"]);
    const token = await vms.createAuthToken({
      microvmIdentifier: vm.microvmId,
      expirationInMinutes: 1,
      allowedPorts: [{ port: 8080 }],
    });
    assert.ok(token.authToken["X-aws-proxy-auth"]);
    assert.equal((await vms.suspendMicrovm({ microvmIdentifier: vm.microvmId })).state, "SUSPENDED");
    assert.equal((await vms.resumeMicrovm({ microvmIdentifier: vm.microvmId })).state, "RUNNING");
    assert.equal((await vms.terminateMicrovm({ microvmIdentifier: vm.microvmId })).state, "TERMINATED");
  });

  it("nats auth - the internal user can watch jobs", { timeout: 30_000 }, async () => {
    let watching!: () => void;
    const ready = new Promise<void>((resolve) => (watching = resolve));
    const watcher = watchJobs(internal, { onWatching: () => watching() });
    const first = watcher.next(); // starts the watch
    await ready;
    const jobId = await natsClient(jobApi, internal).createJob({ content: "watched" });
    const { value } = await first;
    assert.deepEqual({ id: value!.id, content: value!.content }, { id: jobId, content: "watched" });
    await watcher.return(undefined);
  });

  it("nats auth - the internal user replays stored jobs without a consumer", { timeout: 30_000 }, async () => {
    const jobs = natsClient(jobApi, internal);
    const stored = [await jobs.createJob({ content: "stored 1" }), await jobs.createJob({ content: "stored 2" })];
    let watching!: () => void;
    const ready = new Promise<void>((resolve) => (watching = resolve));
    const watcher = watchJobs(internal, { fromStart: true, onWatching: () => watching() });
    const seen: string[] = [];
    let later = "";
    const live = (async () => {
      for await (const job of watcher) {
        seen.push(job.id);
        if (seen.includes(stored[0]!) && seen.includes(stored[1]!) && seen.includes(later)) return;
      }
    })();
    await ready;
    later = await jobs.createJob({ content: "after the replay began" });
    await live;
    assert.ok(seen.indexOf(stored[0]!) < seen.indexOf(stored[1]!), "in order");
    assert.equal(new Set(seen).size, seen.length, "each job once");
  });

  it("nats auth - the internal user cannot write KV or create a bucket", async () => {
    const seen = violation(internal, "$KV.jobs.forged");
    const kv = await new Kvm(internal).open("jobs");
    await assert.rejects(kv.put("forged", "{}", { timeout: 1_000 }));
    await seen;
    assert.equal(await (await new Kvm(admin.nc).open("jobs")).get("forged"), null);
    const creating = violation(internal, /^\$JS\.API\./);
    await assert.rejects(new Kvm(internal).create("mine", { timeout: 1_000 }));
    await creating;
  });

  it("nats auth - an impostor cannot answer tasks.create", async () => {
    const impostor = await as("internal");
    const refused = violation(impostor, "tasks.create");
    impostor.subscribe("tasks.create", {
      queue: "actors.createTask",
      callback: (err, msg) => {
        if (!err) msg.respond('{"id":"forged"}');
      },
    });
    await refused;
    // Every create is answered by a real actor and stored.
    const tasks = natsClient(taskApi, internal);
    for (let i = 0; i < 20; i++) {
      const task = await tasks.createTask({ title: `real ${i}` });
      assert.notEqual(task.id, "forged");
      assert.deepEqual(await tasks.getTask({ id: task.id }), task);
    }
  });

  it("nats auth - a NATS caller acts as nats:internal, whatever principal header it sends", async () => {
    const gateway = await as("gateway");
    const asAlice = headers();
    asAlice.set(PRINCIPAL_HEADER, "alice");
    const body = JSON.stringify({
      idlePolicy: { maxIdleDurationSeconds: 600, suspendedDurationSeconds: 600, autoResumeEnabled: true },
    });
    const { microvmId } = (
      await gateway.request("gateway.microvms.run", body, { timeout: 5_000, headers: asAlice })
    ).json<{ microvmId: string }>();
    const ids = (reply: { json<T>(): T }) =>
      reply.json<{ items: { microvmId: string }[] }>().items.map((item) => item.microvmId);
    assert.ok(
      ids(await gateway.request("gateway.microvms.list", "{}", { timeout: 5_000, headers: asAlice })).includes(
        microvmId,
      ),
    );
    assert.ok(
      !ids(await internal.request("microvms.list", "{}", { timeout: 5_000, headers: asAlice })).includes(microvmId),
    );
    const get = await internal.request("microvms.get", JSON.stringify({ microvmIdentifier: microvmId }), {
      timeout: 5_000,
      headers: asAlice,
    });
    assert.equal(get.headers?.get("Nats-Service-Error-Code"), "404");
    await gateway.request("gateway.microvms.terminate", JSON.stringify({ microvmIdentifier: microvmId }), {
      timeout: 5_000,
      headers: asAlice,
    });
  });
});

describe("nats auth - credentials from the environment", () => {
  it("nats auth - NATS_CREDS, then NATS_USER, then NATS_NKEY, then the role's seed in NATS_AUTH_DIR", async () => {
    const dir = await mkdtemp(join(tmpdir(), "nats-creds-"));
    defer(() => rm(dir, { recursive: true, force: true }));
    const seeds = await ensureNatsCredentials(join(dir, "auth"));
    await writeFile(join(dir, "user.creds"), "-----BEGIN NATS USER JWT-----\njwt\n------END NATS USER JWT------\n");
    await writeFile(join(dir, "seed.nk"), `${seeds.internal.nkeySeed}\n`);
    const all = {
      NATS_CREDS: join(dir, "user.creds"),
      NATS_USER: "u",
      NATS_PASSWORD: "p",
      NATS_NKEY: join(dir, "seed.nk"),
      NATS_AUTH_DIR: join(dir, "auth"),
    };
    assert.match((await credentialsFromEnv(all, "gateway"))!.creds!, /BEGIN NATS USER JWT/);
    assert.deepEqual(await credentialsFromEnv({ ...all, NATS_CREDS: "" }, "gateway"), { user: "u", pass: "p" });
    assert.deepEqual(
      await credentialsFromEnv(
        { NATS_NKEY: all.NATS_NKEY, NATS_AUTH_DIR: all.NATS_AUTH_DIR, NATS_INBOX_PREFIX: "_INBOX_me" },
        "gateway",
      ),
      { nkeySeed: seeds.internal.nkeySeed, inboxPrefix: "_INBOX_me" },
    );
    assert.deepEqual(await credentialsFromEnv({ NATS_AUTH_DIR: all.NATS_AUTH_DIR }, "gateway"), seeds.gateway);
    assert.equal(await credentialsFromEnv({}, "gateway"), undefined);
  });

  it("nats auth - client tools use a local npm start's internal user for its NATS only", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "nats-local-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const seeds = await ensureNatsCredentials(join(dataDir, "nats-auth"));
    await writeFile(join(dataDir, "nats-url"), "nats://127.0.0.1:4999");
    assert.deepEqual(await clientCredentials("nats://127.0.0.1:4999", { DATA_DIR: dataDir }), seeds.internal);
    assert.equal(await clientCredentials("nats://elsewhere:4222", { DATA_DIR: dataDir }), undefined);
  });
});

describe("nats auth - consumers", () => {
  const streams = serviceStreams;

  /**
   * A push consumer delivering into the actors' queue group: what a rogue user would create. On
   * the alarms' work queue it must ack and keep clear of the firing consumer's subjects.
   */
  const rogue = (stream: string, name: string) =>
    JSON.stringify({
      stream_name: stream,
      config: {
        name,
        deliver_subject: "jobs.create",
        deliver_group: "actors",
        ...(stream === OBJECT_ALARMS_STREAM
          ? { ack_policy: "explicit", filter_subject: "objalarm.sched.>" }
          : { ack_policy: "none" }),
      },
    });
  const consumerExists = (stream: string, name: string) =>
    admin.nc
      .request(`$JS.API.CONSUMER.INFO.${stream}.${name}`, "")
      .then((msg) => !(msg.json() as { error?: unknown }).error);

  it("nats auth - the rogue consumer request itself is valid: the test's admin can create it on every stream", async () => {
    for (const stream of streams) {
      const answer = (
        await admin.nc.request(`$JS.API.CONSUMER.CREATE.${stream}.control`, rogue(stream, "control"))
      ).json();
      assert.equal((answer as { error?: unknown }).error, undefined, stream);
      assert.equal(await consumerExists(stream, "control"), true, stream);
      await admin.nc.request(`$JS.API.CONSUMER.DELETE.${stream}.control`, "");
    }
  });

  /** Every subject that creates a consumer: with and without a name, with a filter, the legacy durable form. */
  const createSubjects = (stream: string, name: string) => [
    `$JS.API.CONSUMER.CREATE.${stream}`,
    `$JS.API.CONSUMER.CREATE.${stream}.${name}`,
    `$JS.API.CONSUMER.CREATE.${stream}.${name}.jobs.x`,
    `$JS.API.CONSUMER.DURABLE.CREATE.${stream}.${name}`,
  ];

  // `microvms` included: it reads its object store by direct gets, so it needs no consumer either.
  for (const role of ["gateway", "actors", "microvms", "internal", "provision"] as const) {
    it(`nats auth - ${role} cannot create a push consumer with a foreign deliver subject on any stream`, async () => {
      const nc = await as(role);
      for (const stream of streams) {
        const name = `rogue_${role}`;
        for (const subject of createSubjects(stream, name)) {
          const seen = violation(nc, subject);
          nc.publish(subject, rogue(stream, name));
          assert.deepEqual(await seen, { operation: "publish", subject });
        }
        assert.equal(await consumerExists(stream, name), false, `${role} on ${stream}`);
      }
    });
  }
});

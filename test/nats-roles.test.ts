// No running role may reconfigure a stream: every role's $JS.API requests that create, update,
// delete, snapshot or purge a stream it does not own are Permissions Violations, so none can add
// another role's inbox to a bucket or source the log and snapshot streams into one of its own.
// The provisioning user makes the streams, and an earlier release's streams get the new settings.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jetstreamManager, type StreamConfig } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import {
  authOptions,
  bucketNames,
  connectNats,
  instanceLogStream,
  openBuckets,
  provisionBuckets,
  rolePermissions,
  seedFile,
  serviceStreams,
  snapshotObjectBucket,
  type NatsRole,
} from "../platform/index.ts";
import { provisionMicrovmStores } from "../vm-runtime/service/index.ts";
import { lifo } from "./helpers/defer.ts";
import { runToExit, startServiceProcess } from "./helpers/process.ts";
import { testNats, type TestNats, type TestRole } from "./helpers/nats.ts";

const defer = lifo(after);
const runningRoles = ["gateway", "actors", "microvms", "internal"] as const;
let nats: TestNats;
let admin: NatsConnection;

before(async () => {
  nats = await testNats(defer, { private: true });
  admin = await as("admin");
  // As `npm start` does: the provisioning user makes every stream, then its connection closes.
  const provision = await connectNats({ ...nats.login("provision"), name: "test:provision" });
  await provisionBuckets(provision.nc);
  await provisionMicrovmStores(provision.nc);
  await provision.close();
});

/** A raw nats.js connection as `role` (no reconnects). */
async function as(role: TestRole): Promise<NatsConnection> {
  const { servers, credentials } = nats.login(role);
  const nc = await connect({ servers, name: `test:${role}`, maxReconnectAttempts: 0, ...authOptions(credentials) });
  defer(() => nc.close());
  return nc;
}

/** Publishes each subject on `nc`; resolves with the subjects the server refused (within 5 s). */
async function refusals(nc: NatsConnection, requests: readonly (readonly [string, string])[]): Promise<Set<string>> {
  const wanted = new Set(requests.map(([subject]) => subject));
  const seen = new Set<string>();
  const watching = (async () => {
    for await (const status of nc.status()) {
      if (status.type !== "error") continue;
      const err = status.error as Error & { subject?: string };
      if (err.name !== "PermissionViolationError" || !wanted.has(err.subject!)) continue;
      seen.add(err.subject!);
      if (seen.size === wanted.size) return;
    }
  })();
  for (const [subject, body] of requests) nc.publish(subject, body);
  await nc.flush();
  await Promise.race([watching, new Promise((done) => setTimeout(done, 5_000))]);
  return seen;
}

const info = (stream: string) => jetstreamManager(admin, { checkAPI: false }).then((jsm) => jsm.streams.info(stream));

/** What the capture needs: the stream's own subjects plus the gateway's inbox. */
const withGatewayInbox = (config: StreamConfig) => ({ ...config, subjects: [...config.subjects, "_INBOX_gateway.>"] });

/** Every request that makes, reconfigures, removes or copies out a stream, for `stream`. */
async function reconfiguring(stream: string): Promise<[string, string][]> {
  const { config } = await info(stream);
  const sources = { name: "CAPTURE", subjects: ["capture.>"], sources: [{ name: stream }] };
  return [
    [`$JS.API.STREAM.CREATE.${stream}`, JSON.stringify(withGatewayInbox(config))],
    [`$JS.API.STREAM.UPDATE.${stream}`, JSON.stringify(withGatewayInbox(config))],
    [`$JS.API.STREAM.DELETE.${stream}`, ""],
    [`$JS.API.STREAM.MSG.DELETE.${stream}`, JSON.stringify({ seq: 1 })],
    [`$JS.API.STREAM.SNAPSHOT.${stream}`, JSON.stringify({ deliver_subject: "_INBOX_gateway.snap" })],
    [`$JS.API.STREAM.RESTORE.${stream}`, ""],
    [`$JS.API.STREAM.LEADER.STEPDOWN.${stream}`, ""],
    [`$JS.API.STREAM.PEER.REMOVE.${stream}`, ""],
    [`$JS.API.STREAM.CREATE.CAPTURE`, JSON.stringify(sources)],
  ];
}

/** Where a role owns a stream's content, the purge it needs (permissions say why). */
const purges: Partial<Record<NatsRole, readonly string[]>> = {
  microvms: ["KV_microvms", "OBJ_images", "OBJ_snapshots", instanceLogStream, "KV_objects", "OBJECT_ALARMS"],
};

/** Where a role removes single messages of its own (the actors: a deleted record's index entry). */
const messageDeletes: Partial<Record<NatsRole, readonly string[]>> = {
  actors: ["INDEX_tasks", "INDEX_taskobjects"],
};
const mayDelete = (role: NatsRole, subject: string) =>
  (messageDeletes[role] ?? []).some((stream) => subject === `$JS.API.STREAM.MSG.DELETE.${stream}`);

describe("nats roles - no running role can reconfigure a stream", () => {
  for (const role of runningRoles) {
    it(`nats roles - ${role}: stream create, update, delete, snapshot and foreign purges are refused on every stream`, async () => {
      const nc = await as(role);
      const before = Object.fromEntries(await Promise.all(serviceStreams.map(async (s) => [s, await info(s)])));
      const requests = (await Promise.all(serviceStreams.map(reconfiguring)))
        .flat()
        .filter(([subject]) => !mayDelete(role, subject));
      for (const stream of serviceStreams)
        if (!purges[role]?.includes(stream)) requests.push([`$JS.API.STREAM.PURGE.${stream}`, ""]);
      requests.push(["$JS.API.STREAM.LIST", ""], ["$JS.API.STREAM.NAMES", ""], ["$JS.API.ACCOUNT.PURGE", ""]);
      const refused = await refusals(nc, requests);
      const allowed = requests.map(([subject]) => subject).filter((subject) => !refused.has(subject));
      assert.deepEqual(allowed, [], `${role} may send these`);
      for (const stream of serviceStreams) {
        const now = await info(stream);
        assert.deepEqual(now.config, before[stream].config, `${stream} is as it was`);
        assert.equal(now.state.messages, before[stream].state.messages, `${stream} keeps its messages`);
      }
      await assert.rejects(info("CAPTURE"), /stream not found/);
    });
  }

  it("nats roles - the requests themselves are valid: the provisioning user may update every stream", async () => {
    const jsm = await jetstreamManager(await as("provision"), { checkAPI: false });
    for (const stream of serviceStreams) {
      const { config } = await info(stream);
      await jsm.streams.update(stream, config);
    }
    // And admin (tests only) may make the capture, which is what the roles are refused.
    const control = await jetstreamManager(admin, { checkAPI: false });
    await control.streams.add({ name: "CAPTURE", subjects: ["capture.>"], sources: [{ name: instanceLogStream }] });
    await control.streams.delete("CAPTURE");
  });

  it("nats roles - the actors cannot add the gateway's inbox to KV_tasks", async () => {
    const jsm = await jetstreamManager(await as("actors"), { timeout: 2_000, checkAPI: false });
    const { config } = await info("KV_tasks");
    await assert.rejects(jsm.streams.update("KV_tasks", withGatewayInbox(config)));
    await assert.rejects(jsm.streams.add({ name: "KV_capture", subjects: ["_INBOX_gateway.>"] }));
    assert.deepEqual((await info("KV_tasks")).config.subjects, config.subjects);
    await assert.rejects(info("KV_capture"), /stream not found/);
  });

  it("nats roles - the microVM host cannot source the log and snapshot streams into a stream", async () => {
    const jsm = await jetstreamManager(await as("microvms"), { timeout: 2_000, checkAPI: false });
    const sources = [{ name: instanceLogStream }, { name: `OBJ_${snapshotObjectBucket}` }];
    await assert.rejects(jsm.streams.add({ name: "CAPTURE", subjects: ["capture.>"], sources }));
    // Nor into one of its own: the images bucket.
    const { config } = await info(`KV_${bucketNames.images}`);
    await assert.rejects(jsm.streams.update(config.name, { ...config, sources }));
    await assert.rejects(info("CAPTURE"), /stream not found/);
    assert.equal((await info(`KV_${bucketNames.images}`)).config.sources, undefined);
  });

  it("nats roles - the microVM host takes alarms from the provisioned consumer only, and cannot forge one", async () => {
    const nc = await as("microvms");
    const consumer = JSON.stringify({
      stream_name: "OBJECT_ALARMS",
      config: { durable_name: "mine", deliver_subject: "_INBOX_gateway.alarms", filter_subject: "objalarm.>" },
    });
    const requests: [string, string][] = [
      ["$JS.API.CONSUMER.CREATE.OBJECT_ALARMS.mine", consumer],
      ["$JS.API.CONSUMER.CREATE.OBJECT_ALARMS.mine.objalarm.>", consumer],
      ["$JS.API.CONSUMER.DURABLE.CREATE.OBJECT_ALARMS.mine", consumer],
      ["$JS.API.CONSUMER.DELETE.OBJECT_ALARMS.alarm-firing", ""],
      ["$JS.API.CONSUMER.CREATE.OBJECT_ALARMS.alarm-firing", consumer],
      // A firing is made by the server from a schedule, never published by a host.
      ["objalarm.fire.a.b.c", ""],
      ["$KV.objects2.x", ""],
    ];
    const refused = await refusals(nc, requests);
    assert.deepEqual(
      requests.map(([subject]) => subject).filter((subject) => !refused.has(subject)),
      [],
    );
    const { config } = await jetstreamManager(admin, { checkAPI: false }).then((jsm) =>
      jsm.consumers.info("OBJECT_ALARMS", "alarm-firing"),
    );
    assert.equal(config.filter_subject, "objalarm.fire.>");
  });

  it("nats roles - the provisioning user reads and writes no message and removes nothing", async () => {
    const requests = serviceStreams.flatMap((stream): [string, string][] => [
      [`$JS.API.DIRECT.GET.${stream}`, JSON.stringify({ seq: 1 })],
      [`$JS.API.STREAM.MSG.GET.${stream}`, JSON.stringify({ seq: 1 })],
      [`$JS.API.STREAM.PURGE.${stream}`, ""],
      [`$JS.API.STREAM.DELETE.${stream}`, ""],
      [`$JS.API.CONSUMER.CREATE.${stream}`, ""],
    ]);
    requests.push(["$KV.tasks.forged", "x"], ["$JS.API.STREAM.CREATE.CAPTURE", ""]);
    const refused = await refusals(await as("provision"), requests);
    assert.deepEqual(
      requests.map(([subject]) => subject).filter((subject) => !refused.has(subject)),
      [],
    );
  });
});

describe("nats roles - what each role may send on $JS.API", () => {
  it("nats roles - the grants are these, and no running role's names a create, update or delete", () => {
    const permissions = rolePermissions();
    const jsApi = (role: NatsRole) => permissions[role].publish.allow.filter((s) => s.startsWith("$JS.API."));
    const reads = (stream: string) => [
      `$JS.API.DIRECT.GET.${stream}`,
      `$JS.API.DIRECT.GET.${stream}.>`,
      `$JS.API.STREAM.MSG.GET.${stream}`,
      `$JS.API.STREAM.INFO.${stream}`,
    ];
    const actorStreams = ["KV_tasks", "KV_taskobjects", "KV_jobs", "KV_taskobject-leases"];
    const sorted = (list: string[]) => [...list].sort();
    // The gateway writes the record of removed API keys; the microVM hosts read it.
    const revocations = reads("KV_apikey-revocations");
    assert.deepEqual(sorted(jsApi("gateway")), sorted([...actorStreams.flatMap(reads), ...revocations]));
    // The actors' list indexes: entries read by direct gets, a deleted record's entry removed.
    const indexes = ["INDEX_tasks", "INDEX_taskobjects"].flatMap((stream) => [
      `$JS.API.DIRECT.GET.${stream}`,
      `$JS.API.DIRECT.GET.${stream}.>`,
      `$JS.API.STREAM.MSG.DELETE.${stream}`,
    ]);
    assert.deepEqual(sorted(jsApi("actors")), sorted([...actorStreams.flatMap(reads), ...indexes]));
    assert.deepEqual(sorted(jsApi("internal")), sorted(reads("KV_jobs")));
    const objects = (stream: string) => [
      `$JS.API.STREAM.INFO.${stream}`,
      `$JS.API.STREAM.PURGE.${stream}`,
      `$JS.API.STREAM.MSG.GET.${stream}`,
      `$JS.API.DIRECT.GET.${stream}`,
      `$JS.API.DIRECT.GET.${stream}.>`,
    ];
    assert.deepEqual(
      sorted(jsApi("microvms")),
      sorted([
        ...reads("KV_microvms"),
        "$JS.API.STREAM.PURGE.KV_microvms",
        ...reads("KV_images"),
        ...revocations,
        ...objects("OBJ_images"),
        ...objects("OBJ_snapshots"),
        `$JS.API.STREAM.INFO.${instanceLogStream}`,
        `$JS.API.STREAM.PURGE.${instanceLogStream}`,
        `$JS.API.DIRECT.GET.${instanceLogStream}`,
        `$JS.API.DIRECT.GET.${instanceLogStream}.>`,
        "$JS.API.INFO",
        // Objects: their bucket (a deleted object's keys purged), usage counters, alarms.
        ...reads("KV_objects"),
        "$JS.API.STREAM.PURGE.KV_objects",
        "$JS.API.DIRECT.GET.OBJECT_USAGE",
        "$JS.API.DIRECT.GET.OBJECT_USAGE.>",
        "$JS.API.DIRECT.GET.OBJECT_ALARMS",
        "$JS.API.DIRECT.GET.OBJECT_ALARMS.>",
        "$JS.API.STREAM.PURGE.OBJECT_ALARMS",
        "$JS.API.CONSUMER.MSG.NEXT.OBJECT_ALARMS.alarm-firing",
        "$JS.API.CONSUMER.INFO.OBJECT_ALARMS.alarm-firing",
      ]),
    );
    for (const role of runningRoles)
      for (const subject of jsApi(role)) {
        if (mayDelete(role, subject)) continue;
        assert.doesNotMatch(subject, /\.(CREATE|UPDATE|DELETE|SNAPSHOT|RESTORE)\./, role);
        // The one wildcard: a direct get naming its subject in the request's, on one stream.
        if (/[*>]/.test(subject)) assert.match(subject, /^\$JS\.API\.DIRECT\.GET\.[^.*>]+\.>$/, role);
      }
  });
});

describe("nats roles - provisioning an earlier release's streams", () => {
  it("nats roles - streams made with older settings get the current ones, and the roles open them", async () => {
    const fresh = await testNats(defer, { private: true });
    const login = async (role: TestRole) => {
      const handle = await connectNats({ ...fresh.login(role), name: `test:${role}` });
      defer(() => handle.close());
      return handle.nc;
    };
    const old = await login("admin");
    // As the release before made them: no change feed on tasks, an image store without direct
    // gets or a bound, a log stream with other limits.
    await new Kvm(old).create(bucketNames.tasks, { history: 1, allow_direct: true });
    await new Objm(old).create("images", {});
    const jsm = await jetstreamManager(old, { checkAPI: false });
    await jsm.streams.update("OBJ_images", { ...(await jsm.streams.info("OBJ_images")).config, allow_direct: false });
    await jsm.streams.add({ name: instanceLogStream, subjects: ["microvmlogs.>"], max_msgs_per_subject: 10 });
    const put = await new Kvm(old).open(bucketNames.tasks);
    await put.put("kept", "from the earlier release");

    const provision = await login("provision");
    await provisionBuckets(provision);
    await provisionMicrovmStores(provision);

    assert.ok((await jsm.streams.info("KV_tasks")).config.republish, "tasks feed their changes");
    const images = (await jsm.streams.info("OBJ_images")).config;
    assert.equal(images.allow_direct, true);
    assert.equal(images.max_bytes, 1024 * 1024 * 1024);
    assert.equal((await jsm.streams.info(instanceLogStream)).config.max_msgs_per_subject, 1000);
    const { tasks } = await openBuckets(await login("actors"), { only: ["tasks"] });
    assert.equal((await tasks.get("kept"))?.string(), "from the earlier release");
  });

  it("nats roles - a role opening a store nobody made says what to do", async () => {
    const fresh = await testNats(defer, { private: true });
    const handle = await connectNats({ ...fresh.login("actors"), name: "test:actors" });
    defer(() => handle.close());
    await assert.rejects(openBuckets(handle.nc, { only: ["tasks"] }), {
      name: "StoreNotProvisioned",
      message: /the stream KV_tasks does not exist: the stores are made at start with the provisioning credential/,
    });
  });
});

describe("nats roles - provisioning by a process", () => {
  it("nats roles - a role holding only its own credential opens the stores; --provision makes them first", {
    timeout: 120_000,
  }, async () => {
    const fresh = await testNats(defer, { private: true });
    const dataDir = await mkdtemp(join(tmpdir(), "nats-roles-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    // As compose.yaml runs a role: its own user, no provisioning credential.
    const common = { NATS_URL: fresh.url, NATS_AUTH_DIR: "", DATA_DIR: dataDir };
    const actorsEnv = { ...common, NATS_NKEY: seedFile(fresh.authDir!, "actors"), NATS_INBOX_PREFIX: "_INBOX_actors" };
    const early = await runToExit(["main.ts", "--role", "actors"], actorsEnv);
    assert.equal(early.code, 1);
    assert.match(
      early.stderr,
      /^error: the stream KV_[a-z-]+ does not exist: the stores are made at start with the provisioning credential/m,
    );
    const withoutCredential = await runToExit(["main.ts", "--provision"], actorsEnv);
    assert.equal(withoutCredential.code, 1);
    assert.match(withoutCredential.stderr, /^error: --provision needs the provisioning credential/m);

    const provision = await runToExit(["main.ts", "--provision"], {
      ...common,
      NATS_PROVISION_NKEY: seedFile(fresh.authDir!, "provision"),
    });
    assert.equal(provision.code, 0, provision.stderr);
    const actors = await startServiceProcess(actorsEnv, ["--role", "actors"]);
    defer(() => actors.stop());
    assert.ok(actors.logs.some((line) => line.msg === "no provisioning credential: the stores are opened as they are"));
  });
});

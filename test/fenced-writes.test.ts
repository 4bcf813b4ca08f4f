// A task object's write and its lease's fence as one atomic batch, on a real nats-server:
// what is stored, what is refused, the fallback to a lone fence, and the bucket's settings.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { LeaseLost, Placement, startActors, type Activation } from "../actors/index.ts";
import { natsClient } from "../client/index.ts";
import {
  bucketNames,
  connectNats,
  openBuckets,
  recordChangesSubject,
  recordStore,
  recordStores,
  taskObjectLeaseBucket,
  versionedStore,
  type NatsHandle,
  type VersionedStore,
} from "../platform/index.ts";
import { nameToken, taskApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";

let nats: TestNats;
let client: NatsHandle;
const defer = lifo(after);

before(async () => {
  nats = await testNats(defer, { private: true });
  client = await connectNats({ ...nats.login("admin"), name: "test:fenced-writes" });
  defer(() => client.close());
  await openBuckets(client.nc);
});

/** The lease store with its lone writes and its batches counted. */
function countedLeases(bucket: string = taskObjectLeaseBucket) {
  const inner = versionedStore(client.requester, bucket);
  const counts = { puts: 0, batches: 0 };
  const leases: VersionedStore = {
    ...inner,
    put: (...args) => (counts.puts++, inner.put(...args)),
    putCarrying: (...args) => (counts.batches++, inner.putCarrying(...args)),
  };
  return { leases, counts };
}

/** A placement holding `name` here (a long TTL: no heartbeat renews the lease during a test). */
async function holding(
  name: string,
  leases: VersionedStore,
): Promise<{ placement: Placement; activation: Activation }> {
  const placement = new Placement({ ownerId: `owner-${name}`, leases, ttlMs: 60_000 });
  defer(() => placement.close());
  const route = await placement.route(name);
  if (route.kind !== "local") throw new Error(`${name} not claimed here: ${route.kind}`);
  return { placement, activation: route.activation };
}

describe("fenced writes", () => {
  it("fenced writes - fences asked for together carry their creates in one batch with one lease write", async () => {
    const { leases, counts } = countedLeases();
    const { placement, activation } = await holding("batch-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const keys = Array.from({ length: 40 }, (_, i) => `${nameToken("batch-name")}.rec-${i}`);
    counts.puts = 0;
    const revisions = await Promise.all(
      keys.map((key) =>
        placement.run(activation, (a) => placement.fence(a, store.described.create(key, `{"i":"${key}"}`)), {
          exclusive: false,
        }),
      ),
    );
    assert.deepEqual(counts, { puts: 0, batches: 1 }, "one batch, no lone lease write");
    // Stored in order after the lease's renewal, which is now the activation's revision.
    assert.deepEqual(
      revisions,
      keys.map((_, i) => activation.revision + 1 + i),
    );
    for (const [i, key] of keys.entries()) {
      const entry = await store.entry(key);
      assert.equal(entry?.revision, revisions[i]);
      assert.equal(Buffer.from(entry!.value).toString(), `{"i":"${key}"}`);
    }
    assert.equal((await leases.get(nameToken("batch-name"))).revision, activation.revision);
  });

  it("fenced writes - a batch refused for a write's own check renews the lease alone; the write then goes alone", async () => {
    const { leases, counts } = countedLeases();
    const { placement, activation } = await holding("exists-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const key = `${nameToken("exists-name")}.taken`;
    const first = await store.create(key, "first");
    assert.notEqual(first, "exists");
    const held = activation.revision;
    counts.puts = 0;
    const carried = await placement.run(activation, (a) => placement.fence(a, store.described.create(key, "second")));
    assert.equal(carried, undefined, "not carried: the key exists");
    assert.deepEqual(counts, { puts: 1, batches: 1 }, "the refused batch, then a lone renewal");
    assert.ok(activation.revision > held, "the lease was renewed");
    assert.equal(activation.ended, false);
    assert.equal(await store.create(key, "second"), "exists", "the lone create says why");
    assert.equal(Buffer.from((await store.get(key))!).toString(), "first");
  });

  it("fenced writes - once the lease moved, neither the batch nor the write is stored", async () => {
    const { leases } = countedLeases();
    const { placement, activation } = await holding("stolen-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const token = nameToken("stolen-name");
    const current = await leases.get(token);
    assert.equal(
      typeof (await leases.put(token, JSON.stringify({ owner: "thief", ttlMs: 60_000 }), current.revision)),
      "number",
    );
    const key = `${token}.after-theft`;
    await assert.rejects(
      placement.run(activation, (a) => placement.fence(a, store.described.create(key, "stale"))),
      LeaseLost,
    );
    assert.equal(activation.ended, true);
    assert.equal(await store.lastWrite(key), undefined, "nothing written by the fenced process");
  });

  it("fenced writes - 150 names writing at once: every write is stored, carried or (past the stream's 50 open batches) alone", async (t) => {
    const { leases, counts } = countedLeases();
    const placement = new Placement({ ownerId: "many-names", leases, ttlMs: 60_000 });
    defer(() => placement.close());
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const names = Array.from({ length: 150 }, (_, i) => `many-${i}`);
    const activations = await Promise.all(
      names.map(async (name) => {
        const route = await placement.route(name);
        if (route.kind !== "local") throw new Error(`${name} not claimed here: ${route.kind}`);
        return route.activation;
      }),
    );
    counts.puts = 0;
    const keys = names.map((name) => `${nameToken(name)}.only`);
    // As a handler writes: carried by the fence, or alone after it.
    const written = await Promise.all(
      activations.map((activation, i) =>
        placement.run(activation, async (a) => {
          const carried = await placement.fence(a, store.described.create(keys[i]!, "x"));
          return carried ?? (await store.create(keys[i]!, "x"));
        }),
      ),
    );
    t.diagnostic(`${counts.batches} batches, ${counts.puts} refused and sent alone`);
    assert.equal(counts.batches, names.length);
    for (const [i, key] of keys.entries()) {
      const outcome = written[i]!;
      if (outcome === "exists") assert.fail(`${key}: a create found its key taken`);
      assert.equal((await store.entry(key))?.revision, typeof outcome === "number" ? outcome : outcome.revision);
    }
  });

  it("fenced writes - on a stream without atomic batches each write goes alone after its fence", async () => {
    const bucket = "fenced-no-atomic";
    await new Kvm(client.nc).create(bucket, { history: 1 });
    const { leases, counts } = countedLeases(bucket);
    const { placement, activation } = await holding("plain-name", leases);
    const store = recordStore(client.requester, bucket);
    const key = `${nameToken("plain-name")}.one`;
    counts.puts = 0;
    assert.equal(
      await placement.run(activation, (a) => placement.fence(a, store.described.create(key, "x"))),
      undefined,
    );
    assert.deepEqual(counts, { puts: 1, batches: 1 });
    assert.equal(await store.lastWrite(key), undefined, "the refused batch stored nothing");
    // The store now knows: the next batch is not sent, and the lone renewal fences as before.
    const held = activation.revision;
    assert.equal(
      await placement.run(activation, (a) => placement.fence(a, store.described.create(key, "y"))),
      undefined,
    );
    assert.ok(activation.revision > held);
    const info = await (await jetstreamManager(client.nc)).streams.info(`KV_${bucket}`);
    assert.equal(info.state.messages, 1, "only the lease is stored");
  });

  it("fenced writes - through the actors a task-object create stores its record with its lease's renewal", async () => {
    const actorsNats = await connectNats({ ...nats.login("actors"), name: "fenced-actors" });
    defer(() => actorsNats.close());
    const actors = startActors(actorsNats.nc, recordStores(actorsNats.requester), {
      publisher: actorsNats.publisher,
      placement: { ownerId: "fenced-actors", ttlMs: 60_000 },
    });
    defer(() => actors.close());
    await actorsNats.nc.flush();
    const api = natsClient(taskApi, client.nc);
    const name = "through-actors";
    await api.createTaskDO({ title: "claims the name", name });
    const { taskObjects, taskObjectLeases } = recordStores(client.requester);
    const task = await api.createTaskDO({ title: "fenced", name });
    const record = await taskObjects.entry(`${nameToken(name)}.${task.id}`);
    const lease = await taskObjectLeases.get(nameToken(name));
    assert.equal(record?.revision, lease.revision + 1, "the record right after its lease's renewal, in one batch");
  });

  it("fenced writes - a task-objects stream made before gets atomic batches and a feed of its records only", async () => {
    const admin = await connectNats({ ...nats.login("admin"), name: "fenced-old-stream" });
    defer(() => admin.close());
    const prefix = "oldfeed";
    const jsm = await jetstreamManager(admin.nc);
    const stream = `KV_${bucketNames.taskObjects}`;
    // As the bucket was made before leases moved in: every write fed, no atomic batches.
    const { config } = await jsm.streams.info(stream);
    await jsm.streams.update(stream, {
      ...config,
      allow_atomic: false,
      republish: {
        src: `$KV.${bucketNames.taskObjects}.>`,
        dest: `${recordChangesSubject(prefix)}.${bucketNames.taskObjects}.>`,
        headers_only: true,
      },
    });
    await openBuckets(admin.nc, { only: ["taskObjects"], prefix });
    const updated = (await jsm.streams.info(stream)).config;
    assert.equal(updated.allow_atomic, true);
    let firstFed!: (subject: string) => void;
    const fed = new Promise<string>((resolve) => (firstFed = resolve));
    const sub = admin.nc.subscribe(`${recordChangesSubject(prefix)}.>`, { callback: (_e, m) => firstFed(m.subject) });
    defer(() => sub.unsubscribe());
    await admin.nc.flush();
    const leases = versionedStore(admin.requester, taskObjectLeaseBucket);
    const token = nameToken("feed-name");
    assert.equal(typeof (await leases.put(token, "{}", 0)), "number");
    const records = recordStore(admin.requester, bucketNames.taskObjects);
    assert.notEqual(await records.create(`${token}.rec`, "{}"), "exists");
    // The lease was stored first: had it been fed, its notice would have come first.
    assert.equal(await fed, `${recordChangesSubject(prefix)}.${bucketNames.taskObjects}.${token}.rec`);
  });
});

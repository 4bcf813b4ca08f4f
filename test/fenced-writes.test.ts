// A task object's create carrying its lease's fence (a condition on the lease key's revision,
// checked by the server), on a real nats-server: what is stored, what is refused, how it waits
// for a renewal in flight, which keys may take this path, and the bucket's change feed.
import assert from "node:assert/strict";
import { after, before, describe, it, type TestContext } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { foldsFences, Placement, startActors, type Activation, type ActivationEvent } from "../actors/index.ts";
import { type ClientError, natsClient } from "../client/index.ts";
import {
  bucketNames,
  connectNats,
  openBuckets,
  recordChangesSubject,
  recordStore,
  recordStores,
  leaseBucketFor,
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

/** The lease store with its writes counted. */
function countedLeases() {
  const inner = versionedStore(client.requester, leaseBucketFor());
  const counts = { puts: 0 };
  const leases: VersionedStore = {
    ...inner,
    put: (...args) => {
      counts.puts++;
      return inner.put(...args);
    },
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

/**
 * Actors on their own connection, placement events recorded (a long TTL), stopped after the
 * test `t`: the only actor process serving while it runs.
 */
async function actorsWith(t: TestContext, ownerId: string) {
  const conn = await connectNats({ ...nats.login("actors"), name: ownerId });
  const events: ActivationEvent[] = [];
  const actors = startActors(conn.nc, recordStores(conn.requester), {
    publisher: conn.publisher,
    placement: { ownerId, ttlMs: 60_000, onActivation: (e) => events.push(e) },
  });
  t.after(async () => {
    await actors.close();
    await conn.close();
  });
  await conn.nc.flush();
  return { events, api: natsClient(taskApi, client.nc) };
}

describe("fenced writes", () => {
  it("fenced writes - creates carrying the fence are stored, with no lease write, at the lease's revision", async () => {
    const { leases, counts } = countedLeases();
    const { placement, activation } = await holding("carry-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const keys = Array.from({ length: 40 }, (_, i) => `${nameToken("carry-name")}.rec-${i}`);
    const held = activation.revision;
    counts.puts = 0;
    const outcomes = await Promise.all(
      keys.map((key) =>
        placement.run(
          activation,
          (a) =>
            placement.carryingFence(a, (revision) =>
              store.createFenced(key, `{"k":"${key}"}`, { key: a.key, revision }),
            ),
          { exclusive: false },
        ),
      ),
    );
    assert.equal(counts.puts, 0, "no lease write");
    assert.equal(activation.revision, held);
    for (const [i, key] of keys.entries()) {
      const outcome = outcomes[i]!;
      if (typeof outcome === "string") assert.fail(`${key}: ${outcome}`);
      const entry = await store.entry(key);
      assert.equal(entry?.revision, outcome.revision);
      assert.equal(Buffer.from(entry!.value).toString(), `{"k":"${key}"}`);
    }
    assert.equal((await leases.get(nameToken("carry-name"))).revision, held, "the lease did not move");
  });

  it("fenced writes - once the lease moved, a create carrying the old revision is refused and stores nothing", async () => {
    const { leases } = countedLeases();
    const { placement, activation } = await holding("stolen-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const token = nameToken("stolen-name");
    const stolen = await leases.put(token, JSON.stringify({ owner: "thief", ttlMs: 60_000 }), activation.revision);
    assert.equal(typeof stolen, "number");
    const key = `${token}.after-theft`;
    const outcome = await placement.run(activation, (a) =>
      placement.carryingFence(a, (revision) => store.createFenced(key, "stale", { key: a.key, revision })),
    );
    assert.equal(outcome, "refused");
    assert.equal(await store.lastWrite(key), undefined, "nothing written by the fenced process");
    // The same create at the thief's revision goes through: the refusal was the lease's check.
    const thief = await store.createFenced(key, "fresh", { key: token, revision: stolen as number });
    assert.notEqual(typeof thief, "string");
  });

  it("fenced writes - a create waits for a lease write in flight and carries its new revision", async () => {
    const { leases, counts } = countedLeases();
    const { placement, activation } = await holding("renewing-name", leases);
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const key = `${nameToken("renewing-name")}.during-renewal`;
    const held = activation.revision;
    counts.puts = 0;
    // A fence's renewal is sent first; the create, asked for before it is answered, must not
    // carry the revision the renewal is replacing (it would be refused).
    const renewal = placement.run(activation, (a) => placement.fence(a), { exclusive: false });
    assert.equal(activation.leaseWriting, true, "the renewal is queued");
    const outcome = await placement.run(
      activation,
      (a) => placement.carryingFence(a, (revision) => store.createFenced(key, "x", { key: a.key, revision })),
      { exclusive: false },
    );
    await renewal;
    assert.equal(counts.puts, 1);
    assert.ok(activation.revision > held, "the lease was renewed");
    if (typeof outcome === "string") assert.fail(`the create was ${outcome}`);
    assert.ok(outcome.revision > activation.revision, "the create was stored after the renewal");
  });

  it("fenced writes - a create whose lease writes keep coming is not sent: the caller fences as other writes do", async () => {
    const { leases: counted, counts } = countedLeases();
    let activation!: Activation;
    let placement!: Placement;
    // Every lease write asks for another fence before it is answered, five times: the name's
    // other writes keep its lease busy.
    const leases: VersionedStore = {
      ...counted,
      put: async (...args) => {
        if (activation && counts.puts < 5) void placement.fence(activation).catch(() => undefined);
        return counted.put(...args);
      },
    };
    ({ placement, activation } = await holding("busy-name", leases));
    const store = recordStore(client.requester, bucketNames.taskObjects);
    const key = `${nameToken("busy-name")}.busy`;
    counts.puts = 0;
    void placement.fence(activation);
    const outcome = await placement.run(activation, (a) =>
      placement.carryingFence(a, (revision) => store.createFenced(key, "x", { key: a.key, revision })),
    );
    assert.equal(outcome, "busy");
    assert.equal(await store.lastWrite(key), undefined, "nothing sent");
  });

  it("fenced writes - through the actors a create without an Idempotency-Key is one write: the lease does not move", async (t) => {
    const { api } = await actorsWith(t, "one-write-actors");
    const name = "one-write";
    await api.createTaskDO({ title: "claims the name", name });
    const { taskObjects, taskObjectLeases } = recordStores(client.requester);
    const lease = await taskObjectLeases.get(nameToken(name));
    const tasks = await Promise.all(Array.from({ length: 20 }, (_, i) => api.createTaskDO({ title: `t${i}`, name })));
    for (const task of tasks) {
      const record = await taskObjects.entry(`${nameToken(name)}.${task.id}`);
      assert.equal(Buffer.from(record!.value).toString(), JSON.stringify(task));
    }
    assert.equal((await taskObjectLeases.get(nameToken(name))).revision, lease.revision, "no lease write per create");
  });

  it("fenced writes - through the actors a create whose lease moved is refused, then served by the next activation", async (t) => {
    const { api, events } = await actorsWith(t, "moved-actors");
    const name = "moved-lease";
    await api.createTaskDO({ title: "claims the name", name });
    const { taskObjects, taskObjectLeases } = recordStores(client.requester);
    const token = nameToken(name);
    const lease = await taskObjectLeases.get(token);
    // Another holder (silent, with a short TTL) took the lease behind the owner's back.
    const stolen = await taskObjectLeases.put(token, JSON.stringify({ owner: "thief", ttlMs: 200 }), lease.revision);
    assert.equal(typeof stolen, "number");
    const task = await api.createTaskDO({ title: "after the theft", name });
    const record = await taskObjects.entry(`${token}.${task.id}`);
    const starts = events.filter((e) => e.event === "start");
    const reclaim = starts.at(-1)!;
    assert.equal(starts.length, 2, "claimed again once the thief went silent");
    assert.ok(
      events.some((e) => e.event === "end" && e.reason === "lost" && e.revision === starts[0]!.revision),
      "the first activation ended when its create was refused",
    );
    assert.ok(reclaim.revision > (stolen as number));
    assert.ok(record!.revision > reclaim.revision, "the record was written by the new activation, not before");
  });

  it("fenced writes - a create with a caller's Idempotency-Key keeps the check that its key is new, after a fence", async (t) => {
    // A key a caller chose may have been used long before (past any duplicate window): only
    // the create-only write can tell, so that create is fenced by a lease write first.
    const { api } = await actorsWith(t, "keyed-actors");
    const name = "keyed";
    await api.createTaskDO({ title: "claims the name", name });
    const { taskObjectLeases } = recordStores(client.requester);
    const before = (await taskObjectLeases.get(nameToken(name))).revision;
    const key = crypto.randomUUID();
    const first = await api.createTaskDO({ title: "first", name }, { idempotencyKey: key });
    const fenced = (await taskObjectLeases.get(nameToken(name))).revision;
    assert.ok(fenced > before, "the lease was renewed before the create");
    await assert.rejects(
      api.createTaskDO({ title: "second", name }, { idempotencyKey: key }),
      (err: ClientError) => err.status === 409 && err._tag === "IdempotencyKeyReused",
    );
    assert.deepEqual(await api.createTaskDO({ title: "first", name }, { idempotencyKey: key }), first);
  });

  it("fenced writes - only a one-replica bucket on nats-server 2.12+ carries fences in creates", () => {
    const records = { bucket: bucketNames.taskObjects };
    const leasesOf = (replicas: number) => ({ bucket: leaseBucketFor(replicas) });
    assert.equal(foldsFences("2.15.1", leasesOf(1), records), true);
    assert.equal(foldsFences("2.12.0", leasesOf(1), records), true);
    assert.equal(foldsFences("2.10.27", leasesOf(1), records), false);
    assert.equal(foldsFences(undefined, leasesOf(1), records), false);
    assert.equal(foldsFences("2.15.1", leasesOf(3), records), false);
  });

  it("fenced writes - a task-objects stream made before gets a change feed of its records only", async () => {
    const admin = await connectNats({ ...nats.login("admin"), name: "fenced-old-stream" });
    defer(() => admin.close());
    const prefix = "oldfeed";
    const jsm = await jetstreamManager(admin.nc);
    const stream = `KV_${bucketNames.taskObjects}`;
    // As the bucket was made before leases moved in: every write fed.
    const { config } = await jsm.streams.info(stream);
    await jsm.streams.update(stream, {
      ...config,
      republish: {
        src: `$KV.${bucketNames.taskObjects}.>`,
        dest: `${recordChangesSubject(prefix)}.${bucketNames.taskObjects}.>`,
        headers_only: true,
      },
    });
    await openBuckets(admin.nc, { only: ["taskObjects"], prefix });
    let firstFed!: (subject: string) => void;
    const fed = new Promise<string>((resolve) => (firstFed = resolve));
    const sub = admin.nc.subscribe(`${recordChangesSubject(prefix)}.>`, { callback: (_e, m) => firstFed(m.subject) });
    defer(() => sub.unsubscribe());
    await admin.nc.flush();
    const leases = versionedStore(admin.requester, leaseBucketFor());
    const token = nameToken("feed-name");
    assert.equal(typeof (await leases.put(token, "{}", 0)), "number");
    const records = recordStore(admin.requester, bucketNames.taskObjects);
    assert.notEqual(await records.create(`${token}.rec`, "{}"), "exists");
    // The lease was stored first: had it been fed, its notice would have come first.
    assert.equal(await fed, `${recordChangesSubject(prefix)}.${bucketNames.taskObjects}.${token}.rec`);
  });
});

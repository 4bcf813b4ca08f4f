// Task-object placement on one real nats-server: several actor sets, each on its own
// connection with its own owner id (as separate processes would be), with the default lease TTL:
// a shorter one (600 ms) lapsed whenever a busy machine held a renewal back for 300 ms.
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, describe, it } from "node:test";
import { Kvm } from "@nats-io/kv";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { gatewayDispatch, Placement, startActors, type ActivationEvent, type ActorsHandle } from "../actors/index.ts";
import { httpClient, natsClient } from "../client/index.ts";
import { createGateways } from "../gateway/index.ts";
import { dispatcher } from "../placement/index.ts";
import {
  CONFLICT,
  connectNats,
  provisionBuckets,
  recordStores,
  registry,
  leaseBucketFor,
  startNatsServer,
  type NatsHandle,
  type RecordStores,
} from "../platform/index.ts";
import {
  ANONYMOUS,
  nameToken,
  ownerSubject,
  ownerSubjectRoot,
  PRINCIPAL_HEADER,
  taskApi,
  taskObjectLeaseKey,
} from "../schemas/index.ts";
import { activationIntervals, overlaps } from "./helpers/activations.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";

/** The service's default; a holder keeps its lease through a stall of up to 2/3 TTL − 100 ms. */
const TTL_MS = 2_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A placement of `ownerId` over `leases` that has claimed the task object `name`: it, the lease key and the activation. */
async function claimedHere(
  ownerId: string,
  leases: ConstructorParameters<typeof Placement>[0]["leases"],
  ttlMs: number,
  name: string,
) {
  const placement = new Placement({ ownerId, leases, ttlMs });
  defer(() => placement.close());
  const key = taskObjectLeaseKey(name)!;
  const route = await placement.route(key);
  if (route.kind !== "local") throw new Error(`${name} not claimed here: ${route.kind}`);
  return { placement, key, activation: route.activation };
}

let nats: TestNats;
let client: NatsHandle;
const events: ActivationEvent[] = [];
const defer = lifo(after);

interface ActorProcess {
  readonly ownerId: string;
  readonly handle: NatsHandle;
  readonly actors: ActorsHandle;
}

/** Actor processes of the current test: closed after it, passed or failed, so none serves the next. */
const running: ActorProcess[] = [];
afterEach(async () => {
  for (const p of running.splice(0)) {
    await p.actors.close(); // a second close (after the test's own) does nothing more
    await p.handle.close();
  }
});

/** An actor set on its own connection, like one actor process. */
async function actorProcess(
  ownerId: string,
  settings: { idleMs?: number; routeBudgetMs?: number; stores?: (own: RecordStores) => RecordStores } = {},
): Promise<ActorProcess> {
  const handle = await connectNats({ ...nats.login("actors"), name: ownerId });
  const own = recordStores(handle.requester);
  const actors = startActors(handle.nc, settings.stores?.(own) ?? own, {
    publisher: handle.publisher,
    requester: handle.requester,
    placement: {
      ownerId,
      ttlMs: TTL_MS,
      idleMs: settings.idleMs ?? 60_000,
      routeBudgetMs: settings.routeBudgetMs,
      onActivation: (e) => events.push(e),
    },
  });
  await handle.nc.flush(); // the subscriptions are known to the server before any request
  const started = { ownerId, handle, actors };
  running.push(started);
  return started;
}

/** Ends a process without a goodbye: its connection drops, its leases are left to lapse. */
async function crash(p: ActorProcess): Promise<number> {
  await p.handle.close();
  return Date.now();
}

/** Takes `name`'s lease for `owner` (as a process would after the holder was paused past it). */
async function stealLease(name: string, owner: string): Promise<void> {
  const { taskObjectLeases } = recordStores(client.requester);
  let moved;
  for (let i = 0; i < 5 && typeof moved !== "number"; i++) {
    const entry = await taskObjectLeases.get(nameToken(name)); // the holder renews it meanwhile: retry
    moved = await taskObjectLeases.put(nameToken(name), JSON.stringify({ owner, ttlMs: 60_000 }), entry.revision);
  }
  assert.equal(typeof moved, "number");
}

/**
 * Task-object stores whose creates carrying a fence are recorded; after the first is stored,
 * its answer waits for `first()` (a hang, a renewal refused), as if lost on the way back.
 */
function firstCreateHeld(first: () => Promise<void>) {
  const written: { revision: number }[] = [];
  const stores = (own: RecordStores): RecordStores => ({
    ...own,
    taskObjects: {
      ...own.taskObjects,
      createFenced: async (...args) => {
        const outcome = await own.taskObjects.createFenced(...args);
        if (outcome === "refused") return outcome;
        written.push(outcome);
        if (written.length === 1) await first();
        return outcome;
      },
    },
  });
  return { written, stores };
}

/** A task API gateway on the test's client connection (closed at the end), as its HTTP client. */
async function taskGateway() {
  const gateways = createGateways({ nats: client, ...gatewayDispatch(recordStores(client.requester)) });
  const port = await gateways.task.listen(0, "127.0.0.1");
  defer(() => gateways.task.close());
  return httpClient(taskApi, `http://127.0.0.1:${port}`);
}

/** A task created in a new name `<prefix>-<i>` that was placed on `owner` (wherever a first request lands). */
async function nameOn(api: Awaited<ReturnType<typeof taskGateway>>, owner: string, prefix: string) {
  for (let i = 0; i < 50; i++) {
    const name = `${prefix}-${i}`;
    const created = await api.createTaskDO({ title: "elsewhere", name });
    if (startsOf(name).at(-1)?.owner === owner) return { name, id: created.id };
  }
  assert.fail(`no name was placed on ${owner}`);
}

/**
 * `p` stops answering as a frozen process would: its connection drained (its leases left to
 * lapse), its own subjects kept subscribed by a stand-in that never answers. Resolves to the
 * time from which it writes nothing.
 */
async function freeze(p: ActorProcess): Promise<number> {
  await p.handle.nc.drain().catch(() => undefined);
  const root = ownerSubjectRoot("taskobjects", "byName", p.ownerId);
  const standIn = client.nc.subscribe(`${root}.>`);
  defer(() => standIn.unsubscribe());
  await client.nc.flush();
  return Date.now();
}

const startsOf = (name: string) => events.filter((e) => e.name === name && e.event === "start");

before(async () => {
  nats = await testNats(defer, { private: true });
  client = await connectNats({ ...nats.login("admin"), name: "test:client" });
  defer(() => client.close());
  await provisionBuckets(client.nc);
});

describe("placement", () => {
  it("placement - a name is activated once; requests entering at any process reach that activation", async () => {
    const processes = await Promise.all(["p1", "p2", "p3"].map((id) => actorProcess(`one-${id}`)));
    const api = natsClient(taskApi, client.nc);
    const names = ["alpha", "beta", "gamma", "delta", "epsilon"].map((n) => `one-${n}`);
    // Many requests per name at once, entering at random processes (queue groups).
    const sent = names.flatMap((name) => Array.from({ length: 12 }, (_, i) => ({ title: `${name} ${i}`, name })));
    const created = await Promise.all(sent.map((input) => api.createTaskDO(input)));
    assert.equal(new Set(created.map((task) => task.id)).size, sent.length, "one new task per create");
    for (const [i, task] of created.entries()) {
      assert.equal(task.title, sent[i]!.title, "each create answers with its own task");
      assert.deepEqual(await api.getTaskDO({ id: task.id, name: sent[i]!.name }), task);
    }
    for (const name of names)
      assert.equal(startsOf(name).length, 1, `${name}: one activation, got ${JSON.stringify(startsOf(name))}`);
    const held = processes.map((p) => p.actors.activations);
    assert.equal(
      held.reduce((a, b) => a + b, 0),
      names.length,
      `held per process: ${held}`,
    );
    // The lease key names the owner that logged the activation.
    const kv = await new Kvm(client.nc).open(leaseBucketFor());
    for (const name of names) {
      const entry = await kv.get(nameToken(name));
      assert.equal(entry?.json<{ owner: string }>().owner, startsOf(name)[0]!.owner);
    }
    for (const p of processes) await p.actors.close();
  });

  it("placement - a crashed owner's name is taken over once its lease has lapsed, never before", async () => {
    const [a, b] = [await actorProcess("crash-a"), await actorProcess("crash-b")];
    const api = natsClient(taskApi, client.nc);
    const name = "crash-name";
    // Activate on `a`: with `b` not yet serving, only `a` answers.
    await b.actors.close();
    const first = await api.createTaskDO({ title: "before", name });
    assert.equal(startsOf(name)[0]?.owner, "crash-a");
    const b2 = await actorProcess("crash-b2");
    const diedAt = await crash(a);
    const later = await retryUntilOk(() => api.createTaskDO({ title: "after", name }), 10_000);
    const takeover = startsOf(name).find((e) => e.owner === "crash-b2");
    assert.ok(takeover, "crash-b2 activated the name");
    assert.ok(
      takeover.at - diedAt >= TTL_MS,
      `taken over ${takeover.at - diedAt} ms after the crash, not before the ${TTL_MS} ms TTL`,
    );
    assert.deepEqual(await api.getTaskDO({ id: first.id, name }), first);
    assert.deepEqual(await api.getTaskDO({ id: later.value.id, name }), later.value);
    assert.deepEqual(overlaps(activationIntervals(events.filter((e) => e.name === name)), { "crash-a": diedAt }), []);
    assert.equal(b2.actors.activations, 1);
    await b2.actors.close();
    await a.actors.close(); // stops its timers; its connection is gone, so nothing is released
  });

  it("placement - a process whose lease moved ends its activation and writes nothing", async () => {
    const a = await actorProcess("fence-a");
    const api = natsClient(taskApi, client.nc);
    const name = "fence-name";
    await api.createTaskDO({ title: "first", name });
    // Someone else takes the key (as a process would after `a` was paused past its lease).
    await stealLease(name, "fence-thief");
    const id = crypto.randomUUID();
    // `a`'s next fence or renewal fails: it ends its activation; the request goes to the new
    // owner (no one serves its subject, and its lease is long), so nothing is written.
    await assert.rejects(
      api.createTaskDO({ title: "stale", name }, { idempotencyKey: id }),
      (err: Error & { _tag?: string }) => err._tag === "ServiceUnavailable",
    );
    const lost = events.find((e) => e.name === name && e.event === "end");
    assert.equal(lost?.reason, "lost");
    const { taskObjects } = recordStores(client.requester);
    assert.equal(
      await taskObjects.get(`${nameToken(name)}.${id}`),
      undefined,
      "no record written by the fenced process",
    );
    await a.actors.close();
  });

  it("placement - updates and deletes are refused, as creates are, once the lease moved: nothing written", async () => {
    const a = await actorProcess("fence-writes-a");
    const api = natsClient(taskApi, client.nc);
    const name = "fence-writes";
    const task = await api.createTaskDO({ title: "kept", name });
    const { taskObjects } = recordStores(client.requester);
    const key = `${nameToken(name)}.${task.id}`;
    const before = await taskObjects.entry(key);
    await stealLease(name, "fence-writes-thief");
    const refused = (err: Error & { _tag?: string }) => err._tag === "ServiceUnavailable";
    await assert.rejects(api.updateTaskDO({ id: task.id, name, completed: true }), refused);
    await assert.rejects(api.deleteTaskDO({ id: task.id, name }), refused);
    assert.equal(events.find((e) => e.name === name && e.event === "end")?.reason, "lost");
    assert.equal((await taskObjects.entry(key))?.revision, before?.revision, "the record was not written");
    await a.actors.close();
  });

  it("placement - an idle name is released, and another process claims it without waiting", async (t) => {
    const a = await actorProcess("idle-a", { idleMs: 200 });
    const api = natsClient(taskApi, client.nc);
    const name = "idle-name";
    const leases = await watchLeases([name]);
    await api.createTaskDO({ title: "one", name });
    await waitFor(() => events.some((e) => e.name === name && e.event === "end" && e.reason === "released"), 5_000);
    assert.equal(a.actors.activations, 0);
    await a.actors.close();
    const b = await actorProcess("idle-b");
    const started = Date.now();
    await api.createTaskDO({ title: "two", name });
    t.diagnostic(`claimed by a create that took ${Date.now() - started} ms (lease TTL ${TTL_MS} ms)`);
    const claim = startsOf(name).at(-1)!;
    assert.equal(claim.owner, "idle-b");
    assert.equal(await leases.before(name, claim.revision), "DEL", "claimed over the released lease, not a lapsed one");
    assert.deepEqual(overlaps(activationIntervals(events.filter((e) => e.name === name))), []);
    await b.actors.close();
  });

  it("placement - a closing process finishes its requests and hands its names over at once", async (t) => {
    const a = await actorProcess("close-a");
    const api = natsClient(taskApi, client.nc);
    const names = ["close-1", "close-2", "close-3"];
    const leases = await watchLeases(names);
    for (const name of names) await api.createTaskDO({ title: "held", name });
    const b = await actorProcess("close-b");
    const inFlight = names.map((name) => api.createTaskDO({ title: "during close", name }));
    await a.actors.close();
    // Each request in flight at the close was answered, and what it wrote reads back.
    for (const [i, task] of (await Promise.all(inFlight)).entries())
      assert.deepEqual(await api.getTaskDO({ id: task.id, name: names[i]! }), task);
    const started = Date.now();
    for (const name of names) await api.createTaskDO({ title: "after close", name });
    t.diagnostic(`three creates after the close took ${Date.now() - started} ms (lease TTL ${TTL_MS} ms)`);
    for (const name of names) {
      assert.equal(events.find((e) => e.name === name && e.event === "end")?.reason, "closed");
      const claim = startsOf(name).at(-1)!;
      assert.equal(claim.owner, "close-b");
      assert.equal(await leases.before(name, claim.revision), "DEL", `${name}: claimed over the released lease`);
    }
    assert.deepEqual(overlaps(activationIntervals(events.filter((e) => names.includes(e.name)))), []);
    await b.actors.close();
  });

  it("placement - a claim the server keeps refusing is tried again after a pause, not at once", async () => {
    // As a stream leader cut off from its peers answers while it holds an earlier write of the
    // key in flight: every compare-and-set of the lease is refused, however often it is sent.
    let claims = 0;
    await actorProcess("refused-claims", {
      routeBudgetMs: 1_000,
      stores: (own) => ({
        ...own,
        taskObjectLeases: { ...own.taskObjectLeases, put: async () => (claims++, CONFLICT) },
      }),
    });
    const started = performance.now();
    await assert.rejects(
      natsClient(taskApi, client.nc).createTaskDO({ title: "never claimed", name: "refused-name" }),
      (err: Error & { _tag?: string }) => err._tag === "ServiceUnavailable",
    );
    const spentMs = performance.now() - started;
    // One claim per pause (50 ms) at most, over the time the request was held.
    assert.ok(claims >= 2, `the claim was tried again (${claims})`);
    assert.ok(claims <= spentMs / 50 + 2, `${claims} claims in ${Math.round(spentMs)} ms`);
  });

  it("placement - an update or delete the stream refuses every time answers 503, not 500", async () => {
    // As a stream leader cut off from its peers answers while it holds an earlier write of the
    // key in flight: every revision-checked write of the record is refused ("moved").
    let refused = 0;
    await actorProcess("refused-writes", {
      stores: (own) => ({
        ...own,
        taskObjects: {
          ...own.taskObjects,
          update: async () => (refused++, "moved" as const),
          delete: async () => (refused++, "moved" as const),
        },
      }),
    });
    const api = natsClient(taskApi, client.nc);
    const name = "refused-writes-name";
    const task = await api.createTaskDO({ title: "kept", name });
    const unavailable = (err: Error & { _tag?: string }) => err._tag === "ServiceUnavailable";
    await assert.rejects(api.updateTaskDO({ id: task.id, name, completed: true }), unavailable);
    await assert.rejects(api.deleteTaskDO({ id: task.id, name }), unavailable);
    assert.equal(refused, 10, "each tried its bounded number of times (5)");
    assert.deepEqual(await api.getTaskDO({ id: task.id, name }), task, "the record is as it was");
  });

  it("placement - fences asked for together share one lease write (group commit)", async () => {
    const { taskObjectLeases } = recordStores(client.requester);
    let puts = 0;
    const leases = {
      ...taskObjectLeases,
      put: (key: string, value: string, revision: number) => (puts++, taskObjectLeases.put(key, value, revision)),
    };
    const { placement, activation } = await claimedHere("group-a", leases, 60_000, "group-name");
    puts = 0;
    const fenced = (held: typeof activation) => placement.fence(held).then(() => held.revision);
    const revisions = await Promise.all(
      Array.from({ length: 40 }, () => placement.run(activation, fenced, { exclusive: false })),
    );
    assert.equal(puts, 1, "one compare-and-set for the 40 fences");
    assert.equal(new Set(revisions).size, 1);
    // A fence asked for after that write was sent needs a write of its own.
    await placement.run(activation, fenced, { exclusive: false });
    assert.equal(puts, 2);
  });

  it("placement - a renewal whose answer was lost keeps the lease, and a release after one deletes it", async () => {
    const { taskObjectLeases } = recordStores(client.requester);
    // The next write is applied by the server, but its answer never comes (as a timeout).
    let loseNextAnswer = false;
    const lossy = async (written: Promise<number | "conflict">) => {
      const result = await written;
      if (!loseNextAnswer) return result;
      loseNextAnswer = false;
      throw new Error("the request timed out");
    };
    const leases = {
      ...taskObjectLeases,
      put: (key: string, value: string, revision: number) => lossy(taskObjectLeases.put(key, value, revision)),
      delete: (key: string, revision: number) => lossy(taskObjectLeases.delete(key, revision)),
    };
    const { placement, key, activation } = await claimedHere("lost-answer", leases, 60_000, "lost-answer-name");
    loseNextAnswer = true;
    await assert.rejects(placement.fence(activation), /timed out/);
    // The key moved past the revision the activation knew, with its own value: still its lease.
    await placement.fence(activation);
    assert.ok(activation.live, "the lease is still held");
    assert.equal((await taskObjectLeases.get(key)).revision, activation.revision);
    loseNextAnswer = true;
    await assert.rejects(placement.fence(activation), /timed out/);
    await placement.release(activation);
    assert.equal((await taskObjectLeases.get(key)).value, undefined, "the release deleted the key");
  });

  it("placement - an activation ended by its deadline (renewals unanswered) is still released by its holder", async () => {
    const { taskObjectLeases } = recordStores(client.requester);
    // Once claimed, every renewal goes unanswered, failing as a request that timed out (as on a
    // host too loaded to renew in time); the key is left as it was.
    let hang = false;
    const leases = {
      ...taskObjectLeases,
      put: (key: string, value: string, revision: number) =>
        hang
          ? new Promise<never>((_, reject) => setTimeout(() => reject(new Error("the request timed out")), 700))
          : taskObjectLeases.put(key, value, revision),
    };
    const { placement, key, activation } = await claimedHere("late-renewals", leases, 600, "late-renewals-name");
    hang = true;
    // Its deadline passes (the lease's TTL, 600 ms, and the placement's tick after it).
    const deadline = Date.now() + 10_000;
    while (!activation.ended) {
      assert.ok(Date.now() < deadline, "the activation did not end at its deadline");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(activation.endReason, "expired");
    assert.notEqual((await taskObjectLeases.get(key)).value, undefined, "the key still holds its lease");
    await placement.release(activation);
    assert.equal((await taskObjectLeases.get(key)).value, undefined, "the release deleted the key");
  });

  it("placement - a gateway sends a name's requests straight to its owner, and past a silent one", async () => {
    const a = await actorProcess("gw-a");
    const api = await taskGateway();
    const names = Array.from({ length: 8 }, (_, i) => `gw-${i}`);
    // The first four are placed on `a` (alone then); the rest wherever their first request lands.
    const first = await Promise.all(names.slice(0, 4).map((name) => api.createTaskDO({ title: "first", name })));
    const b = await actorProcess("gw-b");
    first.push(...(await Promise.all(names.slice(4).map((name) => api.createTaskDO({ title: "first", name })))));
    const before = await forwards();
    // With every owner known (read from the lease bucket), no request needs a forward.
    for (let round = 0; round < 5; round++) {
      for (const [i, name] of names.entries()) {
        const task = await api.createTaskDO({ title: `round ${round}`, name });
        assert.deepEqual(await api.getTaskDO({ id: task.id, name }), task);
        assert.deepEqual(await api.getTaskDO({ id: first[i]!.id, name }), first[i]);
      }
    }
    assert.equal(await forwards(), before, "no request was forwarded between actor processes");
    assert.equal(a.actors.activations + b.actors.activations, names.length);
    // `a` stops answering (its subscriptions drained, its leases left to lapse): requests for
    // its names go through `b`, which takes them over once their leases lapse.
    const aNames = names.filter((n) => startsOf(n).at(-1)?.owner === "gw-a");
    assert.ok(aNames.length >= 4, `gw-a holds ${aNames.length} names`);
    const silentAt = Date.now();
    await a.handle.nc.drain().catch(() => undefined);
    for (const name of aNames) {
      const later = await retryUntilOk(() => api.createTaskDO({ title: "after a", name }), 10_000);
      assert.equal(startsOf(name).at(-1)?.owner, "gw-b", `${name} moved to gw-b`);
      assert.deepEqual(await api.getTaskDO({ id: later.value.id, name }), later.value);
    }
    assert.deepEqual(
      overlaps(activationIntervals(events.filter((e) => names.includes(e.name))), { "gw-a": silentAt }),
      [],
    );
    await a.actors.close();
    await b.actors.close();
  });

  for (const known of [false, true]) {
    const how = known ? "sent straight to its owner, then hedged" : "sent on the shared subject, then retried";
    it(`placement - a create whose first attempt wrote but went unanswered (${how}) is answered by a later attempt without a second write`, async () => {
      // The owner stores the first create carrying its fence and then hangs: its answer never
      // comes, so the gateway tries again. That attempt must check the key, not write it again.
      let release!: () => void;
      const hung = new Promise<void>((resolve) => (release = resolve));
      defer(() => release());
      const { written, stores } = firstCreateHeld(() => hung);
      const owner = await actorProcess(`unanswered-${known}`, { stores });
      const api = await taskGateway();
      const name = `unanswered-${known}`;
      // Claimed by a create with a caller's key (fenced apart, not carried): the gateway then
      // knows the owner.
      if (known) await api.createTaskDO({ title: "claims", name }, { idempotencyKey: crypto.randomUUID() });
      assert.equal(written.length, 0);
      const task = await api.createTaskDO({ title: "once", name });
      release();
      assert.equal(written.length, 1, "one write carried its fence; the later attempt was checked");
      const { taskObjects } = recordStores(client.requester);
      const last = await taskObjects.lastWrite(`${nameToken(name)}.${task.id}`);
      assert.equal(last?.revision, written[0]!.revision, "the record was written once");
      assert.deepEqual(await api.getTaskDO({ id: task.id, name }), task);
      assert.equal(owner.actors.activations, 1);
    });
  }

  it("placement - a create forwarded to its owner, which wrote but did not answer in time, is checked when forwarded again", async () => {
    let release!: () => void;
    const hung = new Promise<void>((resolve) => (release = resolve));
    defer(() => release());
    // Held past the forward's 0.5 s attempt.
    const { written, stores } = firstCreateHeld(() => hung);
    const owner = await actorProcess("forward-owner", { stores });
    const name = "forward-twice";
    const api = natsClient(taskApi, client.nc);
    await api.createTaskDO({ title: "claims", name }, { idempotencyKey: crypto.randomUUID() });
    const entry = await actorProcess("forward-entry");
    // Straight to the entry process's own subject, with no key: it makes a fresh one and
    // forwards to the owner, whose first answer never comes; its next forward must be checked.
    // Whoever sends on an owner's subject names the principal, as actors and gateways do.
    const asAnonymous = natsHeaders();
    asAnonymous.set(PRINCIPAL_HEADER, ANONYMOUS);
    const reply = await client.nc.request(
      ownerSubject(taskApi.createTaskDO, entry.ownerId, { name }),
      JSON.stringify({ title: "once" }),
      { timeout: 5_000, headers: asAnonymous },
    );
    release();
    assert.equal(reply.headers?.get("Nats-Service-Error-Code") ?? "", "", reply.string());
    const task = reply.json<{ id: string }>();
    assert.equal(written.length, 1, "one write carried its fence; the second forward was checked");
    const last = await recordStores(client.requester).taskObjects.lastWrite(`${nameToken(name)}.${task.id}`);
    assert.equal(last?.revision, written[0]!.revision, "the record was written once");
    assert.equal(owner.actors.activations, 1);
  });

  it("placement - a create whose activation ended after its write is checked when run again", async () => {
    // The first create carrying its fence is stored; then the lease's next renewal is refused
    // (as if taken over), so that answer is withheld and the request runs again, in the next
    // activation, which must check the key rather than write it again.
    let refuseNext = false;
    let refused!: () => void;
    const renewalRefused = new Promise<void>((resolve) => (refused = resolve));
    // Held until the heartbeat's renewal (within a third of the TTL) was refused.
    const held = firstCreateHeld(() => {
      refuseNext = true;
      return renewalRefused;
    });
    const { written } = held;
    await actorProcess("ended-owner", {
      stores: (own) => {
        const stores = held.stores(own);
        return {
          ...stores,
          taskObjectLeases: {
            ...stores.taskObjectLeases,
            put: async (...args) => {
              if (!refuseNext) return own.taskObjectLeases.put(...args);
              refuseNext = false;
              refused();
              return CONFLICT;
            },
          },
        };
      },
    });
    const name = "ended-twice";
    const api = natsClient(taskApi, client.nc);
    await api.createTaskDO({ title: "claims", name }, { idempotencyKey: crypto.randomUUID() });
    const task = await api.createTaskDO({ title: "once", name });
    assert.equal(written.length, 1, "one write carried its fence; the run in the next activation was checked");
    const last = await recordStores(client.requester).taskObjects.lastWrite(`${nameToken(name)}.${task.id}`);
    assert.equal(last?.revision, written[0]!.revision, "the record was written once");
    assert.deepEqual(
      events.filter((e) => e.name === name).map((e) => `${e.event}${e.reason ? ` ${e.reason}` : ""}`),
      ["start", "end lost", "start"],
    );
  });

  it("placement - a request its frozen owner leaves unanswered is answered, in that one request, by the process taking the name over", async () => {
    const a = await actorProcess("frozen-a");
    const api = await taskGateway();
    const name = "frozen-name";
    const first = await api.createTaskDO({ title: "on a", name }); // placed on `a`, alone then
    const b = await actorProcess("frozen-b");
    // A name placed on `b`, then created in again, straight at `b`: the gateway has seen `b`
    // answer, so the hedge goes there first (a short attempt, answered TakeoverPending), then
    // with the time left.
    const onB = await nameOn(api, "frozen-b", "frozen-other");
    await api.createTaskDO({ title: "again on b", name: onB.name });
    // `a` freezes: its subjects stay subscribed (by a stand-in that never answers), its lease lapses.
    const frozenAt = await freeze(a);
    // One request, no retry: the gateway's hedge waits at `b` for the takeover and is answered there.
    const task = await api.createTaskDO({ title: "after a froze", name });
    assert.equal(startsOf(name).at(-1)?.owner, "frozen-b", "the name moved to b");
    assert.deepEqual(await api.getTaskDO({ id: first.id, name }), first);
    assert.deepEqual(await api.getTaskDO({ id: task.id, name }), task);
    assert.deepEqual(
      overlaps(activationIntervals(events.filter((e) => e.name === name)), { "frozen-a": frozenAt }),
      [],
    );
    await b.actors.close();
  });

  it("placement - a hedge that first reaches another silent process still finds the one taking the name over", async () => {
    const a = await actorProcess("twice-a");
    const api = await taskGateway();
    const name = "twice-name";
    const first = await api.createTaskDO({ title: "on a", name }); // placed on `a`, alone then
    const c = await actorProcess("twice-c");
    const onC = await nameOn(api, "twice-c", "twice-other");
    // Sent again, each goes straight to its owner: the gateway has seen `a` and `c` answer, and
    // no other process.
    await api.createTaskDO({ title: "again on a", name });
    await api.createTaskDO({ title: "again on c", name: onC.name });
    const b = await actorProcess("twice-b");
    // `a` and `c` freeze: their own subjects stay subscribed by stand-ins that never answer,
    // and `a`'s lease lapses. The hedge of `a`'s request goes first to `c`, the one process
    // the gateway saw answer.
    const frozenAt = await freeze(a);
    await freeze(c);
    // One request, no retry, within the gateway's 5 s: `a` and `c` are each given a short
    // attempt, then the shared subject reaches `b`, which takes the name over and answers.
    const task = await api.createTaskDO({ title: "after a and c froze", name });
    assert.equal(startsOf(name).at(-1)?.owner, "twice-b", "the name moved to b");
    assert.deepEqual(await api.getTaskDO({ id: first.id, name }), first);
    assert.deepEqual(await api.getTaskDO({ id: task.id, name }), task);
    assert.deepEqual(overlaps(activationIntervals(events.filter((e) => e.name === name)), { "twice-a": frozenAt }), []);
    await b.actors.close();
  });

  it("placement - a gateway whose NATS connection is down answers an owned request 503 without trying its owner", async () => {
    // A connection of its own to a server of its own, which then stops: the connection stays
    // down, reconnecting. Every request attempt then fails at once without anything to wait on;
    // a hedge that tried again and again would hold the event loop (the reconnect with it) for
    // the whole budget.
    const storeDir = await mkdtemp(join(tmpdir(), "placement-down-"));
    defer(() => rm(storeDir, { recursive: true, force: true }));
    const server = await startNatsServer({ storeDir });
    const handle = await connectNats({ servers: server.url, name: "placement-down" });
    defer(() => handle.close());
    await server.stop();
    await waitFor(() => !handle.connected(), 10_000);
    let attempts = 0;
    const sender = { ...handle, connected: () => (attempts++, handle.connected()) };
    let lookups = 0;
    const dispatch = dispatcher(sender, "", { byName: async () => (lookups++, "placement-down-owner") });
    await assert.rejects(
      dispatch(taskApi.getTaskDO, { id: "x", name: "down" }, {}, { timeoutMs: 5_000, attemptMs: 1_500 }),
      (err: Error & { _tag?: string }) => err._tag === "ServiceUnavailable",
    );
    assert.ok(
      attempts <= 2,
      `the connection was checked ${attempts} times: the request was tried, not refused at once`,
    );
    assert.equal(lookups, 0, "no owner looked up");
  });
});

/** Requests actor processes passed on to an owner so far (all outcomes). */
async function forwards(): Promise<number> {
  const metric = await registry.getSingleMetric("task_object_forwards_total")?.get();
  return (metric?.values ?? []).reduce((sum, v) => sum + v.value, 0);
}

async function retryUntilOk<T>(call: () => Promise<T>, timeoutMs: number): Promise<{ value: T; failures: number }> {
  const deadline = Date.now() + timeoutMs;
  for (let failures = 0; ; failures++) {
    try {
      return { value: await call(), failures };
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await sleep(50);
    }
  }
}

/**
 * Follows the lease keys of `names` from now on. `before(name, revision)` is the operation (PUT,
 * DEL) that came just before the claim at `revision`: DEL when the claim took a released lease,
 * PUT when it waited out a lease that lapsed.
 */
async function watchLeases(names: readonly string[]) {
  const kv = await new Kvm(client.nc).open(leaseBucketFor());
  const changes: { key: string; operation: string; revision: number }[] = [];
  const watcher = await kv.watch({ key: names.map(nameToken) });
  defer(() => watcher.stop());
  void (async () => {
    for await (const e of watcher) changes.push({ key: e.key, operation: e.operation, revision: e.revision });
  })();
  return {
    async before(name: string, revision: number): Promise<string | undefined> {
      await waitFor(() => changes.some((c) => c.revision >= revision), 5_000);
      return changes.filter((c) => c.key === nameToken(name) && c.revision < revision).at(-1)?.operation;
    },
  };
}

async function waitFor(check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await sleep(20);
  }
}

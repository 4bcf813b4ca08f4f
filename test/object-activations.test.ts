// Activations of objects on a real NATS with real sandbox instances, the session standing in for
// an object's runtime (its code runs here, on the fenced storage the activation opens): one
// activation per object across hosts, calls one at a time, ObjectBusy past the limit, a call
// timeout, idle eviction, takeover of a gone host, fencing of a superseded one, alarms.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { EventEmitter, once } from "node:events";
import { microvmObjectsBusy, OBJECTS_BUCKET, versionedStore, type NatsHandle } from "../platform/index.ts";
import { ApiError } from "../schemas/index.ts";
import { leaseOwner } from "../placement/index.ts";
import { builtinImages, createSandboxProvider, type SandboxProvider } from "../vm-runtime/service/index.ts";
import {
  ObjectError,
  objectAlarms,
  objectKey,
  startAlarmFiring,
  type ObjectHibernation,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import {
  startObjectActivations,
  type HostObjectActivations,
  type ObjectActivationsOptions,
} from "../vm-runtime/objects/activations.ts";
import type { ObjectImages, OpenSession, SessionRequest } from "../vm-runtime/objects/launch.ts";
import type { ObjectAnswer, ObjectTraits } from "../vm-runtime/objects/types.ts";
import type { ImageRecord } from "../vm-runtime/registry/store.ts";
import { lifo } from "./helpers/defer.ts";
import { OBJECT_SETTLE_MS, objectsNats, type ObjectsNats, rejected, until } from "./helpers/objects.ts";

const defer = lifo(after);
let env: ObjectsNats;
let provider: SandboxProvider;
let n = 0;
const fresh = (principal = "alice", image = "counter"): ObjectRef => ({ principal, image, name: `object ${++n}` });

const json = (status: number, value: unknown): ObjectAnswer => ({
  status,
  body: new TextEncoder().encode(JSON.stringify(value)),
});
const answerValue = (answer: ObjectAnswer): unknown => JSON.parse(Buffer.from(answer.body).toString("utf8"));

/** The registry: every image but `missing` exists, its module the example image. */
const images: ObjectImages = {
  latest: async (owner, name) =>
    name === "missing"
      ? undefined
      : ({ name, digest: "sha256:0", methods: [], createdAt: "", owner } satisfies ImageRecord),
  version: async () => undefined,
  fetch: async (record) => ({ digest: record.digest, path: builtinImages.sandbox, release() {} }),
};

/**
 * Sessions whose object code runs here: `inc` adds one to `n` in storage, `visits` counts its
 * calls in the session's memory (an activation's: the next starts from 0), `wait` waits for
 * `release`, `hang` never answers; the alarm writes `alarmed`. `opened` hears each session opened.
 */
function objectCode(idleSeconds = 60, hibernate: ObjectTraits["hibernate"] = "none") {
  const events = new EventEmitter();
  const sessions: SessionRequest[] = [];
  let release: () => void = () => undefined;
  let released = new Promise<void>((r) => (release = r));
  const openSession: OpenSession = async (request) => {
    if (request.object.image === "plain") throw new ObjectError("NotAnObject", 400, "not an object");
    sessions.push(request);
    events.emit("opened", request);
    let close!: () => void;
    const closed = new Promise<void>((resolve) => (close = resolve));
    const { storage } = request;
    let visits = 0;
    return {
      traits: { idleSeconds, hibernate, alarm: true },
      async call(method) {
        if (method === "visits") return json(200, ++visits);
        if (method === "inc") {
          const next = (((await storage.get("n")) as number | undefined) ?? 0) + 1;
          await storage.put("n", next).catch((err: unknown) => {
            events.emit("refused", err);
            throw err;
          });
          return json(200, next);
        }
        if (method === "wait") {
          events.emit("waiting");
          await released;
          return json(200, "done");
        }
        return new Promise<ObjectAnswer>(() => undefined); // hang
      },
      async alarm() {
        await storage.put("alarmed", true);
        events.emit("alarm", request.object);
        return json(200, null);
      },
      closed,
      close,
    };
  };
  return {
    events,
    sessions,
    openSession,
    release() {
      release();
      released = new Promise<void>((r) => (release = r));
    },
  };
}

type Code = ReturnType<typeof objectCode>;

/** Resolves once `count` calls of `wait` are waiting. */
function waitings(code: Code, count: number): Promise<void> {
  return new Promise((resolve) => {
    let seen = 0;
    const heard = () => {
      if (++seen < count) return;
      code.events.off("waiting", heard);
      resolve();
    };
    code.events.on("waiting", heard);
  });
}

/**
 * The hosts' lease unless a test is about a lease that lapses: long enough to outlast a loaded
 * machine's pauses. With 1 s, a pause past it lapsed every lease at once and each object started
 * again, its memory gone (seen in CI as 4 sessions where 2 were counted, and as an object whose
 * count went back to 1). Lapses are the subject of the tests of hosts that die or are paused.
 */
const STEADY_LEASE_MS = 10_000;
/** The lease of the test whose host dies: short, so the take-over it waits for comes soon. */
const LAPSING_LEASE_MS = 1_000;

/** A host's activations on its own connection; closed at the end unless the test closed it. */
async function startHost(
  hostId: string,
  code: Code,
  options: Partial<ObjectActivationsOptions> = {},
): Promise<{ objects: HostObjectActivations; handle: NatsHandle }> {
  const handle = await env.as();
  const objects = startObjectActivations({
    nc: handle.nc,
    requester: handle.requester,
    prefix: "",
    hostId,
    images,
    provider,
    openSession: code.openSession,
    leaseTtlMs: STEADY_LEASE_MS,
    ...options,
  });
  // Closing twice is harmless: the second finds nothing held and the relay drained.
  defer(() => objects.close());
  return { objects, handle };
}

before(async () => {
  env = await objectsNats(defer);
  provider = await createSandboxProvider({ hostKey: `object-activations-${process.pid}`, permissions: false });
  defer(() => provider.close());
});

describe("object activations", () => {
  it("object activations - 40 concurrent calls through two hosts run one at a time: 1..40 each once", async () => {
    const code = objectCode();
    const a = await startHost("host-a", code);
    const b = await startHost("host-b", code);
    const object = fresh();
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, i) => (i % 2 ? a : b).objects.call(object, "inc", [])),
    );
    assert.deepEqual(
      answers.map(answerValue).sort((x, y) => Number(x) - Number(y)),
      Array.from({ length: 40 }, (_, i) => i + 1),
    );
    assert.equal(code.sessions.length, 1, "one activation served every call");
    const holder = await a.objects.activeOn(object);
    assert.ok(holder === "host-a" || holder === "host-b");
    assert.equal(await b.objects.activeOn(object), holder);
  });

  it("object activations - two principals with the same image and name are two objects", async () => {
    const code = objectCode();
    const a = await startHost("host-a2", code);
    const alice = fresh("alice");
    const bob = { ...alice, principal: "bob" };
    assert.equal(answerValue(await a.objects.call(alice, "inc", [])), 1);
    assert.equal(answerValue(await a.objects.call(alice, "inc", [])), 2);
    assert.equal(answerValue(await a.objects.call(bob, "inc", [])), 1);
    assert.equal(code.sessions.length, 2);
  });

  it("object activations - calls past the waiting limit are refused with ObjectBusy and a retry time", async () => {
    const code = objectCode();
    const a = await startHost("host-busy", code, { maxPending: 4 });
    const object = fresh();
    const waiting = once(code.events, "waiting");
    const first = a.objects.call(object, "wait", []);
    await waiting;
    const queued = [1, 2, 3].map(() => a.objects.call(object, "inc", []));
    const busyBefore = (await microvmObjectsBusy.get()).values[0]?.value ?? 0;
    const busy = await rejected(() => a.objects.call(object, "inc", []));
    assert.equal((await microvmObjectsBusy.get()).values[0]?.value, busyBefore + 1, "counted");
    assert.equal(busy.status, 429);
    assert.equal(busy._tag, "ObjectBusy");
    assert.equal(busy.body.retryAfterSeconds, 1);
    code.release();
    assert.equal(answerValue(await first), "done");
    assert.deepEqual((await Promise.all(queued)).map(answerValue), [1, 2, 3]);
  });

  it("object activations - a call that never answers times out, and the next call activates the object afresh", async () => {
    const code = objectCode();
    const a = await startHost("host-timeout", code, { callTimeoutMs: 500 });
    const object = fresh();
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 1);
    const timedOut = await a.objects.call(object, "hang", []);
    assert.equal(timedOut.status, 504);
    assert.equal((answerValue(timedOut) as { error: { _tag: string } }).error._tag, "ObjectCallTimeout");
    assert.deepEqual(a.objects.activeHere(), []);
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 2);
    assert.equal(code.sessions.length, 2);
  });

  it("object activations - an idle object is evicted (lease released) and reactivated with its storage", async () => {
    const code = objectCode(1);
    const a = await startHost("host-idle", code);
    const object = fresh();
    const leases = versionedStore(a.handle.requester, OBJECTS_BUCKET);
    const key = objectKey(object);
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 1);
    assert.equal(leaseOwner((await leases.get(key)).value), "host-idle", "leased while active");
    // Eviction stops the instance first, then releases the lease.
    await until(async () => a.objects.activeHere().length === 0 && !leaseOwner((await leases.get(key)).value));
    assert.equal(await a.objects.activeOn(object), undefined);
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 2);
    assert.equal(code.sessions.length, 2);
  });

  it("object activations - at its most active objects a host evicts the least recently called idle one", async () => {
    const code = objectCode();
    const a = await startHost("host-full", code, { maxActive: 2 });
    const [first, second, third] = [fresh(), fresh(), fresh()];
    assert.equal(answerValue(await a.objects.call(first, "inc", [])), 1);
    assert.equal(answerValue(await a.objects.call(second, "inc", [])), 1);
    assert.equal(answerValue(await a.objects.call(first, "inc", [])), 2);
    assert.equal(answerValue(await a.objects.call(third, "inc", [])), 1);
    const names = () => a.objects.activeHere().map((o) => o.name);
    assert.deepEqual(names().sort(), [first.name, third.name].sort(), "the second, least recently called, went");
    assert.equal(answerValue(await a.objects.call(second, "inc", [])), 2);
    assert.equal(a.objects.activeHere().length, 2);
  });

  it("object activations - a principal at its most objects evicts its own least recently called, never another's", async () => {
    const code = objectCode();
    const a = await startHost("host-per-principal", code, { maxActive: 3, maxActivePerPrincipal: 2 });
    const bob = fresh("bob");
    const [first, second, third] = [fresh("alice"), fresh("alice"), fresh("alice")];
    assert.equal(answerValue(await a.objects.call(bob, "visits", [])), 1);
    assert.equal(answerValue(await a.objects.call(first, "visits", [])), 1);
    assert.equal(answerValue(await a.objects.call(second, "visits", [])), 1);
    // Bob's is the least recently called of all: the host's limit alone would evict it.
    assert.equal(answerValue(await a.objects.call(third, "visits", [])), 1);
    const names = () => a.objects.activeHere().map((o) => o.name);
    assert.deepEqual(names().sort(), [bob.name, second.name, third.name].sort(), "alice's first went");
    assert.equal(answerValue(await a.objects.call(bob, "visits", [])), 2, "bob's object kept its memory");
    assert.equal(answerValue(await a.objects.call(first, "visits", [])), 1, "alice's first was evicted");
    assert.deepEqual(names().sort(), [bob.name, first.name, third.name].sort(), "then alice's second went");
  });

  it("object activations - a principal whose objects all have a call under way is refused ObjectLimitExceeded", async () => {
    const code = objectCode();
    const a = await startHost("host-principal-busy", code, { maxActive: 3, maxActivePerPrincipal: 2 });
    const leases = versionedStore(a.handle.requester, OBJECTS_BUCKET);
    const bob = fresh("bob");
    const [first, second, third] = [fresh("alice"), fresh("alice"), fresh("alice")];
    assert.equal(answerValue(await a.objects.call(bob, "visits", [])), 1);
    const waiting = waitings(code, 2);
    const busy = [first, second].map((object) => a.objects.call(object, "wait", []));
    await waiting;
    const refused = await rejected(() => a.objects.call(third, "visits", []));
    assert.equal(refused.status, 429);
    assert.equal(refused._tag, "ObjectLimitExceeded");
    assert.equal(refused.body.limit, 2);
    assert.equal(refused.body.retryAfterSeconds, 1);
    assert.equal(leaseOwner((await leases.get(objectKey(third))).value), undefined, "its lease is not kept");
    assert.equal(answerValue(await a.objects.call(bob, "visits", [])), 2, "bob's object kept its memory");
    code.release();
    assert.deepEqual((await Promise.all(busy)).map(answerValue), ["done", "done"]);
    // Idle now: the third takes the place of alice's least recently called.
    assert.equal(answerValue(await a.objects.call(third, "visits", [])), 1);
  });

  it("object activations - starts under way count against a principal's most objects", async () => {
    const code = objectCode();
    const a = await startHost("host-principal-starts", code, { maxActivePerPrincipal: 2 });
    // Three first calls at once, each waiting once started: one is refused, or all three wait.
    const twoWaiting = waitings(code, 2);
    const allWaiting = waitings(code, 3).then(() => "three started");
    const calls = [fresh("alice"), fresh("alice"), fresh("alice")].map((object) => a.objects.call(object, "wait", []));
    const first = await Promise.race([...calls.map((call) => call.then(String, (err: unknown) => err)), allWaiting]);
    assert.ok(first instanceof ApiError, `a refusal, got ${String(first)}`);
    assert.equal(first._tag, "ObjectLimitExceeded");
    await twoWaiting;
    assert.equal(a.objects.activeHere().length, 2);
    code.release();
    const settled = await Promise.allSettled(calls);
    assert.deepEqual(settled.map((s) => s.status).sort(), ["fulfilled", "fulfilled", "rejected"]);
    assert.equal(code.sessions.length, 2, "no instance started past the limit");
  });

  it("object activations - a stopping host gives up a hibernation past its bound and releases the lease", async (t) => {
    const code = objectCode(60, "snapshot");
    // A snapshot store that never answers.
    const given: AbortSignal[] = [];
    const hibernation: ObjectHibernation = {
      save: (_object, _handle, _digest, signal) => {
        if (signal) given.push(signal);
        return new Promise<void>(() => undefined);
      },
      restore: async () => undefined,
      discard: async () => undefined,
    };
    const a = await startHost("host-stops", code, { hibernation, stopHibernateMs: 500 });
    const leases = versionedStore(a.handle.requester, OBJECTS_BUCKET);
    const object = fresh();
    assert.equal(answerValue(await a.objects.call(object, "visits", [])), 1);
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    const hung = new Promise<"hung">((resolve) => {
      timer = setTimeout(() => resolve("hung"), OBJECT_SETTLE_MS);
    });
    assert.equal(await Promise.race([a.objects.close(), hung]), undefined, "the stop did not wait for the store");
    clearTimeout(timer);
    t.diagnostic(`the stop took ${Math.round(performance.now() - started)} ms`);
    assert.equal(given.length, 1, "the stop hibernated the object");
    assert.equal(given[0]!.aborted, true, "and gave it up");
    assert.equal(leaseOwner((await leases.get(objectKey(object))).value), undefined, "its lease was released");
  });

  it("object activations - deactivate through another host stops the activation where it runs; storage stays", async () => {
    const code = objectCode();
    const a = await startHost("host-holds", code);
    const b = await startHost("host-asks", code);
    const object = fresh();
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 1);
    assert.equal(await b.objects.activeOn(object), "host-holds");
    await b.objects.deactivate(object);
    assert.deepEqual(a.objects.activeHere(), []);
    assert.equal(await b.objects.activeOn(object), undefined);
    assert.equal(answerValue(await b.objects.call(object, "inc", [])), 2);
    assert.equal(await a.objects.activeOn(object), "host-asks");
  });

  it("object activations - a host gone silent is taken over within the lease bound, storage kept", async () => {
    const code = objectCode();
    const a = await startHost("host-dies", code, { leaseTtlMs: LAPSING_LEASE_MS });
    const b = await startHost("host-lives", code, { leaseTtlMs: LAPSING_LEASE_MS });
    const object = fresh();
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 1);
    assert.equal(await b.objects.activeOn(object), "host-dies");
    // Its connection ends without a word: no release, no renewal, nobody on its relay subject.
    await a.handle.close();
    const started = performance.now();
    assert.equal(answerValue(await b.objects.call(object, "inc", [])), 2);
    const took = performance.now() - started;
    assert.ok(took < 3 * LAPSING_LEASE_MS + 2_000, `taken over in ${Math.round(took)} ms`);
    assert.equal(await b.objects.activeOn(object), "host-lives");
  });

  it("object activations - a superseded holder's write is refused and its activation stopped", async () => {
    const code = objectCode();
    // Renewals far apart: the write below finds the lease taken before a renewal does.
    const a = await startHost("host-old", code, { leaseTtlMs: 30_000 });
    const object = fresh();
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 1);
    // Another host took the lease over (as after this one was paused past its lease).
    const leases = versionedStore(a.handle.requester, OBJECTS_BUCKET);
    const key = objectKey(object);
    await leases.put(key, JSON.stringify({ owner: "host-new", ttlMs: 1_000 }), (await leases.get(key)).revision);
    const refused = once(code.events, "refused");
    // The write of the activation superseded is refused; the call then runs where the object is
    // now: once the taker's lease lapses unused, a new activation here, on the storage as it was.
    assert.equal(answerValue(await a.objects.call(object, "inc", [])), 2);
    const [err] = (await refused) as [ObjectError];
    assert.ok(err instanceof ObjectError);
    assert.equal(err._tag, "ActivationSuperseded");
    assert.equal(code.sessions.length, 2, "the superseded activation was replaced");
  });

  it("object activations - ImageNotFound and NotAnObject, and the lease is not kept", async () => {
    const code = objectCode();
    const a = await startHost("host-errors", code);
    const leases = versionedStore(a.handle.requester, OBJECTS_BUCKET);
    const missing = fresh("alice", "missing");
    const plain = fresh("alice", "plain");
    const notFound = await rejected(() => a.objects.call(missing, "inc", []));
    assert.equal(notFound.status, 404);
    assert.equal(notFound._tag, "ImageNotFound");
    const notObject = await rejected(() => a.objects.call(plain, "inc", []));
    assert.equal(notObject.status, 400);
    assert.equal(notObject._tag, "NotAnObject");
    assert.equal(leaseOwner((await leases.get(objectKey(plain))).value), undefined);
    assert.deepEqual(a.objects.activeHere(), []);
  });

  it("object activations - a due alarm activates the object and runs its alarm, also after a host restart", async () => {
    const code = objectCode();
    const first = await startHost("host-alarm", code);
    const object = fresh();
    const alarms = objectAlarms(first.handle.requester);
    const firing = await startAlarmFiring(first.handle.nc, first.objects.fireAlarm);
    const ran = once(code.events, "alarm");
    await alarms.set(object, Date.now());
    assert.deepEqual((await ran)[0], object);
    await firing.close();
    await first.objects.close();

    // The alarm set while no host fires alarms runs once one starts.
    const other = fresh();
    await alarms.set(other, Date.now());
    const again = await startHost("host-alarm", code);
    const ranAgain = once(code.events, "alarm");
    const firingAgain = await startAlarmFiring(again.handle.nc, again.objects.fireAlarm);
    defer(() => firingAgain.close());
    assert.deepEqual((await ranAgain)[0], other);
    assert.equal(await code.sessions.at(-1)!.storage.get("alarmed"), true);
  });
});

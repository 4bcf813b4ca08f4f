// Object alarms on a real NATS, as the microVM host role: they fire after a SIGKILL and restart of
// the server, a throwing handler is retried with backoff then given up, setting replaces, delete
// cancels, and an object or principal setting alarms in a loop is bounded.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { OBJECT_ALARMS_STREAM, type NatsHandle } from "../platform/index.ts";
import {
  ObjectError,
  objectAlarms,
  objectKey,
  startAlarmFiring,
  type AlarmFiringOptions,
  type AlarmHandler,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import { lifo } from "./helpers/defer.ts";
import { objectsNats, type ObjectsNats } from "./helpers/objects.ts";

const defer = lifo(after);
let env: ObjectsNats;
let host: NatsHandle;
let admin: NatsHandle;
let n = 0;
const fresh = (principal = "alice"): ObjectRef => ({ principal, image: "clock", name: `object ${++n}` });
// Alarms set in these tests fire this soon after they are set.
const MIN_INTERVAL_MS = 300;

before(async () => {
  env = await objectsNats(defer);
  host = await env.as();
  admin = await env.as("admin");
});

interface Fired {
  key: string;
  at: number;
}

/**
 * Fires alarms with `handler` (default: records them) until the test ends; `fired(key)` resolves
 * at the firing of `key` that the handler returned from.
 */
async function firing(
  t: { after(fn: () => Promise<void>): void },
  handle: NatsHandle,
  options: AlarmFiringOptions & { handler?: AlarmHandler } = {},
) {
  const log: Fired[] = [];
  const waiters = new Map<string, () => void>();
  const handler = options.handler ?? (async () => {});
  const started = await startAlarmFiring(
    handle.nc,
    async (key) => {
      log.push({ key, at: Date.now() });
      await handler(key);
      waiters.get(key)?.();
    },
    options,
  );
  // One host takes the alarms of each test: the consumer is shared.
  t.after(() => started.close());
  return { log, fired: (key: string) => new Promise<void>((resolve) => waiters.set(key, resolve)) };
}

/** Messages the alarm stream holds for `key` (its schedule and a pending firing). */
async function held(key: string): Promise<number> {
  const jsm = await jetstreamManager(admin.nc);
  const info = await jsm.streams.info(OBJECT_ALARMS_STREAM, { subjects_filter: `objalarm.*.${key}` });
  return Object.values(info.state.subjects ?? {}).reduce((sum, count) => sum + count, 0);
}

describe("object alarms", () => {
  it("object alarms - an alarm fires after a SIGKILL and restart of NATS", async (t) => {
    const alarms = objectAlarms(host.requester, { minIntervalMs: 0 });
    const object = fresh();
    const key = objectKey(object);
    const at = await alarms.set(object, Date.now() + 1_500);
    assert.equal(await alarms.get(object), at);
    await env.restart(true);
    const hosts = await firing(t, await env.as());
    await hosts.fired(key);
    assert.equal(hosts.log.length, 1);
    assert.ok(hosts.log[0]!.at >= at, "not before its time");
    assert.equal(await alarms.get(object), null);
  });

  it("object alarms - a throwing handler is retried with backoff, then given up and removed", async (t) => {
    const alarms = objectAlarms(host.requester, { minIntervalMs: MIN_INTERVAL_MS });
    const object = fresh();
    const key = objectKey(object);
    const backoffMs = [200, 400];
    let gaveUp: (err: unknown) => void = () => {};
    const givenUp = new Promise<unknown>((resolve) => (gaveUp = resolve));
    const hosts = await firing(t, host, {
      backoffMs,
      attempts: 3,
      handler: async (fired) => {
        if (fired === key) throw new Error("the alarm handler failed");
      },
      onGiveUp: (fired, err) => fired === key && gaveUp(err),
    });
    await alarms.set(object, Date.now());
    assert.match(String(await givenUp), /the alarm handler failed/);
    const times = hosts.log.filter((f) => f.key === key).map((f) => f.at);
    assert.equal(times.length, 3, "three attempts");
    assert.ok(times[1]! - times[0]! >= backoffMs[0]!, `first retry after ${times[1]! - times[0]!} ms`);
    assert.ok(times[2]! - times[1]! >= backoffMs[1]!, `second retry after ${times[2]! - times[1]!} ms`);
    // A terminated message leaves the work queue at once.
    for (let i = 0; i < 100 && (await held(key)) > 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(await held(key), 0, "the given-up alarm is gone");
  });

  it("object alarms - setting an alarm replaces the object's last", async (t) => {
    const alarms = objectAlarms(host.requester, { minIntervalMs: 0 });
    const object = fresh();
    const key = objectKey(object);
    const hosts = await firing(t, host);
    await alarms.set(object, Date.now() + 400);
    const later = await alarms.set(object, Date.now() + 1_200);
    assert.equal(await alarms.get(object), later);
    await hosts.fired(key);
    const mine = hosts.log.filter((f) => f.key === key);
    assert.equal(mine.length, 1, "fired once");
    assert.ok(mine[0]!.at >= later, `fired ${later - mine[0]!.at} ms before the second time`);
  });

  it("object alarms - deleting an alarm cancels it", async (t) => {
    const alarms = objectAlarms(host.requester, { minIntervalMs: 0 });
    const cancelled = fresh();
    const sentinel = fresh();
    const hosts = await firing(t, host);
    await alarms.set(cancelled, Date.now() + 300);
    await alarms.delete(cancelled);
    assert.equal(await alarms.get(cancelled), null);
    // An alarm due later than the cancelled one: once it fired, the cancelled one would have.
    await alarms.set(sentinel, Date.now() + 800);
    await hosts.fired(objectKey(sentinel));
    assert.deepEqual(
      hosts.log.filter((f) => f.key === objectKey(cancelled)),
      [],
    );
  });

  it("object alarms - a loop of setAlarm keeps one schedule, fires no sooner than the minimum interval", async (t) => {
    const alarms = objectAlarms(host.requester, { minIntervalMs: MIN_INTERVAL_MS });
    const object = fresh();
    const key = objectKey(object);
    const hosts = await firing(t, host);
    const start = Date.now();
    for (let i = 0; i < 500; i++) await alarms.set(object, 0);
    assert.equal(await held(key), 1, "one schedule in the stream");
    await hosts.fired(key);
    const mine = hosts.log.filter((f) => f.key === key);
    assert.equal(mine.length, 1);
    assert.ok(mine[0]!.at - start >= MIN_INTERVAL_MS, `fired ${mine[0]!.at - start} ms after the first set`);
  });

  it("object alarms - a principal has at most its limit of alarms; another principal is not affected", async (t) => {
    const alarms = objectAlarms(host.requester, { maxPerPrincipal: 3, minIntervalMs: 0 });
    const principal = `limited ${++n}`;
    const objects = [fresh(principal), fresh(principal), fresh(principal)];
    const far = Date.now() + 3_600_000;
    for (const object of objects) await alarms.set(object, far);
    await alarms.set(objects[0]!, far + 1); // moving one is not another
    const err = await alarms.set(fresh(principal), far).then(
      () => assert.fail("a fourth alarm"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ObjectError && err._tag === "TooManyAlarms", String(err));
    await alarms.set(fresh(`${principal} other`), far);
    await alarms.delete(objects[1]!);
    await alarms.set(fresh(principal), far);
    for (const object of objects) await alarms.delete(object);
  });
});

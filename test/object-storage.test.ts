// Object storage on a real NATS, as the microVM host role: durable puts, fenced writes, bounds,
// the per-principal quota, lists that cost a page, and a deleted object's keys purged page by page.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { OBJECTS_BUCKET, Requester, versionedStore, type NatsHandle } from "../platform/index.ts";
import {
  MAX_STORAGE_KEY_BYTES,
  MAX_STORAGE_VALUE_BYTES,
  activationFence,
  ObjectError,
  objectKey,
  objectStores,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import { nameToken } from "../schemas/index.ts";
import { Placement, type Activation } from "../placement/index.ts";
import { lifo } from "./helpers/defer.ts";
import { objectsNats, testLease, type ObjectsNats } from "./helpers/objects.ts";

const defer = lifo(after);
let env: ObjectsNats;
let host: NatsHandle;
let n = 0;
/** A new object of `principal` per test. */
const fresh = (principal = "alice"): ObjectRef => ({ principal, image: "counter", name: `object ${++n}` });

before(async () => {
  env = await objectsNats(defer);
  host = await env.as();
});

/** `fn` fails with an `ObjectError` tagged `tag`. */
async function refused(fn: () => Promise<unknown>, tag: string): Promise<ObjectError> {
  const err = await fn().then(
    () => assert.fail(`expected ${tag}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ObjectError, `an ObjectError, got ${String(err)}`);
  assert.equal(err._tag, tag, err.message);
  return err;
}

describe("object storage", () => {
  it("object storage - a put survives a restart of NATS, read by a new connection", async () => {
    const object = fresh();
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const storage = objectStores(host.requester).open(object, lease.fence);
    await storage.put("n", { count: 41 });
    await env.restart();
    const again = await env.as();
    const read = objectStores(again.requester).open(object, testLease(again, object, "host-b").fence);
    assert.deepEqual(await read.get("n"), { count: 41 });
    assert.equal(await read.get("absent"), undefined);
  });

  it("object storage - a superseded activation's write is refused and changes nothing", async () => {
    const object = fresh();
    const first = testLease(host, object, "host-a");
    await first.claim();
    const stores = objectStores(host.requester);
    const old = stores.open(object, first.fence);
    await old.put("k", "from a");
    const second = testLease(host, object, "host-b");
    await second.claim();
    await refused(() => old.put("k", "late from a"), "ActivationSuperseded");
    await refused(() => old.delete("k"), "ActivationSuperseded");
    const current = stores.open(object, second.fence);
    assert.equal(await current.get("k"), "from a");
    await current.put("k", "from b");
    assert.equal(await current.get("k"), "from b");
  });

  it("object storage - a write whose token a renewal moved is renewed and written", async () => {
    const object = fresh();
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const claimed = lease.revision;
    await lease.renew(); // the heartbeat moved the lease after the token was taken
    let renewals = 0;
    const fence = {
      token: () => ({ leaseKey: objectKey(object), revision: renewals ? lease.revision : claimed }),
      renew: async () => {
        renewals++;
        await lease.renew();
      },
    };
    await objectStores(host.requester).open(object, fence).put("k", 1);
    assert.equal(renewals, 1);
  });

  it("object storage - writes through placement's activation carry its fence across renewals, refused once it ended", async () => {
    const leases = versionedStore(host.requester, OBJECTS_BUCKET);
    const a = new Placement({ ownerId: "host-a", leases, ttlMs: 600 });
    defer(() => a.close());
    const object = fresh();
    const route = await a.route(objectKey(object));
    assert.equal(route.kind, "local");
    const activation = (route as { activation: Activation }).activation;
    const storage = objectStores(host.requester).open(object, activationFence(a, activation));
    // Puts for several renewal periods (a third of the TTL each): every one is written.
    let puts = 0;
    for (const end = Date.now() + 1_000; Date.now() < end; ) await storage.put("n", puts++);
    assert.ok(activation.revision > activation.claimRevision + 2, "the lease was renewed meanwhile");
    assert.equal(await storage.get("n"), puts - 1);
    await a.close();
    const b = new Placement({ ownerId: "host-b", leases, ttlMs: 600 });
    defer(() => b.close());
    assert.equal((await b.route(objectKey(object))).kind, "local");
    await refused(() => storage.put("n", -1), "ActivationSuperseded");
    assert.equal(await storage.get("n"), puts - 1);
  });

  it("object storage - keys and values over the bounds are refused with what the bound is", async () => {
    const object = fresh();
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const storage = objectStores(host.requester).open(object, lease.fence);
    const longest = "é".repeat(MAX_STORAGE_KEY_BYTES / 2);
    await storage.put(longest, true);
    assert.equal(await storage.get(longest), true);
    const key = await refused(() => storage.put(`${longest}x`, true), "StorageKeyInvalid");
    assert.match(key.message, /at most 512 bytes/);
    await refused(() => storage.put("", true), "StorageKeyInvalid");
    const biggest = "x".repeat(MAX_STORAGE_VALUE_BYTES - 2); // with its quotes
    await storage.put("big", biggest);
    const value = await refused(() => storage.put("big", `${biggest}x`), "StorageValueInvalid");
    assert.match(value.message, /at most 131072 bytes/);
    await refused(() => storage.put("u", undefined), "StorageValueInvalid");
    assert.equal((await storage.get("big")) as string, biggest);
  });

  it("object storage - the quota of a principal counts all its objects and refuses what does not fit", async () => {
    const quotaBytes = 10_000;
    const stores = objectStores(host.requester, { quotaBytes });
    const principal = `quota ${++n}`;
    const open = async (object: ObjectRef) => {
      const lease = testLease(host, object, "host-a");
      await lease.claim();
      return stores.open(object, lease.fence);
    };
    const one = await open(fresh(principal));
    const two = await open(fresh(principal));
    await one.put("a", "x".repeat(4_000));
    await two.put("a", "x".repeat(4_000));
    const used = await stores.usage.bytes(principal);
    assert.ok(used > 8_000 && used < 8_100, `${used} bytes counted`);
    const err = await refused(() => two.put("b", "x".repeat(4_000)), "StorageQuotaExceeded");
    assert.match(err.message, /store \d+ of 10000 bytes/);
    assert.equal(await two.get("b"), undefined, "nothing written");
    assert.equal(await stores.usage.bytes(principal), used, "the reservation given back");
    // Another principal's objects have a quota of their own.
    await (await open(fresh(`other ${n}`))).put("b", "x".repeat(4_000));
    // Shrinking and deleting give bytes back.
    assert.equal(await one.delete("a"), true);
    assert.equal(await one.delete("a"), false);
    await two.put("b", "x".repeat(4_000));
    await two.put("a", "small");
    assert.equal(await stores.usage.bytes(principal), 2 + 4_002 + (2 + 7));
  });

  it("object storage - a list page costs one request, whatever the bucket holds", async () => {
    const object = fresh();
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const writer = objectStores(host.requester).open(object, lease.fence);
    // Another object's keys in the same bucket, which no page of this one reads.
    const other = fresh();
    const otherLease = testLease(host, other, "host-a");
    await otherLease.claim();
    const noise = objectStores(host.requester).open(other, otherLease.fence);
    await Promise.all(Array.from({ length: 300 }, (_, i) => noise.put(`noise ${i}`, i)));
    for (let i = 0; i < 250; i++) await writer.put(`${i % 2 ? "odd" : "even"} ${i}`, i);
    await writer.delete("even 0");

    const counting = new CountingRequester(host.nc);
    defer(() => counting.close());
    const reader = objectStores(counting).open(object, lease.fence);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const before = counting.sent;
      const page = await reader.list({ limit: 100, ...(cursor ? { cursor } : {}) });
      assert.equal(counting.sent - before, 1, "one request per page");
      assert.ok(page.items.length <= 100);
      seen.push(...page.items.map((item) => item.key));
      cursor = page.cursor;
      pages++;
    } while (cursor);
    assert.equal(pages, 3);
    assert.equal(seen.length, 249);
    assert.equal(new Set(seen).size, 249);
    assert.ok(!seen.includes("even 0"), "a deleted key is not listed");
    const odd = await reader.list({ prefix: "odd", limit: 1000 });
    assert.equal(odd.items.length, 125);
    assert.deepEqual(odd.items[0], { key: "odd 1", value: 1 });
    assert.equal(odd.cursor, undefined);
  });

  it("object storage - deleting an object purges its keys a page per call and gives its bytes back", async () => {
    const principal = `purge ${++n}`;
    const object = fresh(principal);
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const stores = objectStores(host.requester);
    const storage = stores.open(object, lease.fence);
    for (let i = 0; i < 25; i++) await storage.put(`k${i}`, i);
    const kept = fresh(principal);
    const keptLease = testLease(host, kept, "host-a");
    await keptLease.claim();
    await stores.open(kept, keptLease.fence).put("stays", true);
    let calls = 0;
    while (!(await stores.purgePage(object, 10))) calls++;
    assert.equal(calls, 2, "three pages of ten");
    assert.deepEqual((await storage.list()).items, []);
    assert.equal(await stores.usage.bytes(principal), "c3RheXM".length + "true".length, "only the other object's key");
    assert.equal(await stores.open(kept, keptLease.fence).get("stays"), true);
    assert.equal(await stores.usage.objectBytes(objectKey(object)), 0, "the purged object counts nothing");
  });

  it("object storage - each object's bytes are counted beside its principal's, through puts, rewrites and deletes", async () => {
    const principal = `bytes ${++n}`;
    const [one, two] = [fresh(principal), fresh(principal)];
    const stores = objectStores(host.requester);
    const open = async (object: ObjectRef) => {
      const lease = testLease(host, object, "host-a");
      await lease.claim();
      return stores.open(object, lease.fence);
    };
    const [first, second] = [await open(one), await open(two)];
    await first.put("a", "xyz"); // key token "YQ", value "\"xyz\"": 2 + 5
    await first.put("a", 1); // rewritten: 2 + 1
    await first.put("bb", [1, 2]); // "YmI" + "[1,2]": 3 + 5
    await second.put("c", true); // "Yw" + "true": 2 + 4
    assert.equal(await stores.usage.objectBytes(objectKey(one)), 3 + 8);
    assert.equal(await stores.usage.objectBytes(objectKey(two)), 6);
    assert.equal(await stores.usage.bytes(principal), 3 + 8 + 6);
    assert.equal(await first.delete("bb"), true);
    assert.equal(await stores.usage.objectBytes(objectKey(one)), 3);
    assert.equal(await stores.usage.bytes(principal), 3 + 6);
  });
});

describe("object storage - hostile code", () => {
  it("object storage - a loop of puts is bounded: new keys stop at the quota, rewrites keep one message", async () => {
    const quotaBytes = 50_000;
    const stores = objectStores(host.requester, { quotaBytes });
    const principal = `flood ${++n}`;
    const object = fresh(principal);
    const lease = testLease(host, object, "host-a");
    await lease.claim();
    const storage = stores.open(object, lease.fence);
    let stored = 0;
    const err = await (async () => {
      for (;;) await storage.put(`key ${stored++}`, "x".repeat(1_000));
    })().catch((e: unknown) => e);
    assert.ok(err instanceof ObjectError && err._tag === "StorageQuotaExceeded", String(err));
    const written = stored - 1; // the last was refused
    assert.ok(written > 40 && written < 50, `${written} puts before the quota`);
    assert.ok((await stores.usage.bytes(principal)) <= quotaBytes);
    for (let i = 0; i < 300; i++) await storage.put("key 0", i);
    const admin = await env.as("admin");
    const jsm = await jetstreamManager(admin.nc);
    const info = await jsm.streams.info(`KV_${OBJECTS_BUCKET}`, {
      subjects_filter: `$KV.${OBJECTS_BUCKET}.${objectKey(object)}.*`,
    });
    assert.equal(info.state.subjects?.[`$KV.${OBJECTS_BUCKET}.${objectKey(object)}.${nameToken("key 0")}`], 1);
    assert.equal(Object.keys(info.state.subjects ?? {}).length, written, "one message per key");
  });
});

/** A requester that counts the requests it sends. */
class CountingRequester extends Requester {
  sent = 0;
  override requestMany(...args: Parameters<Requester["requestMany"]>) {
    this.sent++;
    return super.requestMany(...args);
  }
}

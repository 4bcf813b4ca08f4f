// Stored-image limits against a real NATS: a per-principal quota of versions and bytes (old
// versions count; 429 naming the limit), and `max_bytes` on the image buckets, so a full
// image store leaves the task and job buckets their space.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jetstreamManager } from "@nats-io/jetstream";
import { digestOf, ImageStore, type ImageRecord } from "../vm-runtime/registry/store.ts";
import { connectNats, imageObjectBucket } from "../platform/index.ts";
import { ApiError, nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { postJson, startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
let svc: TestService;

before(async () => {
  svc = await startService(defer);
});

/** An image store as the microVM host opens it: its own NATS user, its own cache directory. */
async function openStore(options: Parameters<typeof ImageStore.open>[2]) {
  const provisioner = await connectNats({ ...svc.nats.login("provision"), name: "test:provision" });
  await ImageStore.provision(provisioner.nc, options);
  await provisioner.close();
  const handle = await connectNats({ ...svc.nats.login("microvms"), name: "test:images" });
  defer(() => handle.close());
  const dir = await mkdtemp(join(tmpdir(), "image-quota-"));
  defer(() => rm(dir, { recursive: true, force: true }));
  return ImageStore.open(handle.nc, dir, options);
}

let serial = 0;
/** A distinct module of `size` bytes. */
const moduleOf = (size: number) => {
  const head = `// ${++serial}\n`;
  return Buffer.from(head + "x".repeat(Math.max(0, size - head.length)));
};
const recordOf = (owner: string, name: string, module: Uint8Array): ImageRecord => ({
  name,
  digest: digestOf(module),
  methods: [],
  createdAt: new Date().toISOString(),
  owner,
});
const push = (images: ImageStore, owner: string, name: string, module: Uint8Array) =>
  images.register(recordOf(owner, name, module), module);

/** The declared error a push was refused with: its status and wire body. */
async function refusal(promise: Promise<unknown>) {
  const err = await promise.then(
    () => assert.fail("the push was accepted"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApiError, String(err));
  const body = err.body as { _tag: string; limit?: string; quota?: number; message?: string };
  return { ...body, status: err.status };
}

describe("image quota - per principal", () => {
  let images: ImageStore;
  before(async () => {
    images = await openStore({ quota: { versions: 3, bytes: 10_000 }, storeMiB: 64 });
  });

  it("image quota - the same module pushed again stores nothing new and passes", async () => {
    const owner = "carol";
    const module = moduleOf(100);
    for (let i = 0; i < 5; i++) await push(images, owner, "same", module);
    assert.equal((await images.objectsOf(owner, "same")).length, 1);
  });

  it("image quota - a version count quota refuses the next version, other principals unaffected", async () => {
    for (const name of ["a", "a", "b"]) await push(images, "dave", name, moduleOf(100));
    const err = await refusal(push(images, "dave", "c", moduleOf(100)));
    assert.deepEqual([err._tag, err.status, err.limit, err.quota], ["ImageQuotaExceeded", 429, "versions", 3]);
    assert.match(
      err.message!,
      /you store 3 image versions \(old versions and pushes under way count\), the most allowed is 3/,
    );
    assert.equal(await images.latest("dave", "c"), undefined, "nothing registered");
    await push(images, "erin", "c", moduleOf(100));
    // Deleting a name frees its versions.
    await images.delete("dave", "a", async () => undefined);
    await push(images, "dave", "c", moduleOf(100));
  });

  it("image quota - a byte quota counts old versions and refuses a push past it", async () => {
    await push(images, "frank", "big", moduleOf(6_000));
    const err = await refusal(push(images, "frank", "big", moduleOf(6_000)));
    assert.deepEqual([err._tag, err.status, err.limit, err.quota], ["ImageQuotaExceeded", 429, "bytes", 10_000]);
    assert.match(err.message!, /take 6000 bytes \(old versions and pushes under way count\)/);
    await push(images, "frank", "small", moduleOf(3_000));
  });
});

describe("image quota - concurrent pushes", () => {
  /** `count` hosts' image stores: each its own NATS connection, as separate processes. */
  const hosts = (count: number, quota: { versions: number; bytes: number }) =>
    Promise.all(Array.from({ length: count }, () => openStore({ quota, storeMiB: 64 })));

  /** Pushes `count` distinct modules of `size` bytes at once, spread over `stores`. */
  const pushAll = (stores: ImageStore[], owner: string, count: number, size: number) =>
    Promise.allSettled(
      Array.from({ length: count }, (_, i) => push(stores[i % stores.length]!, owner, `n${i}`, moduleOf(size))),
    );

  /** What `owner` stores: every version of every name it pushed. */
  async function storedBy(images: ImageStore, owner: string, names: number) {
    const objects = await Promise.all(Array.from({ length: names }, (_, i) => images.objectsOf(owner, `n${i}`)));
    return objects.flat().length;
  }

  for (const limit of ["bytes", "versions"] as const) {
    it(`image quota - 12 pushes at once over 3 hosts never pass the ${limit} quota; the refused get 429, nothing stays reserved`, async () => {
      const owner = `many-${limit}`;
      // Room for 5 modules of 10,000 bytes either way.
      const quota = limit === "bytes" ? { versions: 100, bytes: 50_000 } : { versions: 5, bytes: 10_000_000 };
      const stores = await hosts(3, quota);
      const results = await pushAll(stores, owner, 12, 10_000);
      const refused = results.flatMap((r) => (r.status === "rejected" ? [r.reason] : []));
      for (const err of refused) {
        assert.ok(err instanceof ApiError, String(err));
        assert.deepEqual([err.status, err.body._tag, err.body.limit], [429, "ImageQuotaExceeded", limit]);
      }
      assert.equal(results.length - refused.length, 5, "as many pass as the quota has room for");
      assert.equal(await storedBy(stores[0]!, owner, 12), 5);
      for (const images of stores) assert.deepEqual(await images.quota.reserved(owner), {});
    });
  }

  it("image quota - a push that fails after reserving gives its room back", async () => {
    const owner = "ivan";
    const quota = { versions: 100, bytes: 4 * 1024 * 1024 };
    // A store too small for them all: JetStream refuses some writes after their room is reserved.
    const small = await openStore({ quota, storeMiB: 1 });
    const results = await pushAll([small], owner, 12, 200 * 1024);
    const failed = results.flatMap((r) => (r.status === "rejected" ? [r.reason as Error] : []));
    assert.ok(failed.length > 0, "the store refused some");
    for (const err of failed) assert.ok(!(err instanceof ApiError), `not a quota refusal: ${String(err)}`);
    assert.deepEqual(await small.quota.reserved(owner), {});
    // The store as the other tests expect it.
    await openStore({ quota, storeMiB: 64 });
  });

  it("image quota - another host's push under way counts; one whose host died lapses", async () => {
    const owner = "judy";
    const images = await openStore({ quota: { versions: 100, bytes: 30_000 }, storeMiB: 64 });
    const reserve = (bytes: number, until: number) =>
      images.kv.put(
        `${nameToken(owner)}.usage`,
        JSON.stringify({ reservations: { [`${owner}/elsewhere`]: { bytes, until } } }),
      );
    await reserve(25_000, Date.now() + 60_000);
    const err = await refusal(push(images, owner, "mine", moduleOf(10_000)));
    assert.deepEqual([err.status, err.limit], [429, "bytes"]);
    assert.match(err.message!, /your images take 25000 bytes/);
    await reserve(25_000, Date.now() - 1);
    await push(images, owner, "mine", moduleOf(10_000));
    assert.deepEqual(await images.quota.reserved(owner), {});
  });
});

describe("image quota - store limits", () => {
  it("image store - max_bytes is set on the image buckets, also on ones made before", async () => {
    const handle = await connectNats({ ...svc.nats.login("admin"), name: "test:admin-images" });
    defer(() => handle.close());
    const jsm = await jetstreamManager(handle.nc);
    await openStore({ storeMiB: 8 });
    assert.equal((await jsm.streams.info(`OBJ_${imageObjectBucket}`)).config.max_bytes, 8 * 1024 * 1024);
    assert.equal((await jsm.streams.info("KV_images")).config.max_bytes, 1024 * 1024);
  });

  it("image store - with the image store full, task and job creates still answer 200", async () => {
    const images = await openStore({ storeMiB: 1, quota: { versions: 1000, bytes: 1024 * 1024 * 1024 } });
    // Fill it: 200 KiB modules, one principal each (no quota in the way), until JetStream refuses.
    let full: Error | undefined;
    for (let i = 0; i < 20 && !full; i++) {
      await push(images, `filler${i}`, "fill", moduleOf(200 * 1024)).catch((err: Error) => (full = err));
    }
    assert.ok(full, "the image store refused a write");
    assert.match(full.message, /maximum bytes exceeded|insufficient resources|resource/i);
    const task = await postJson(`${svc.taskUrl}/`, { title: "after the image store filled" });
    assert.equal(task.status, 200);
    const job = await postJson(`${svc.jobUrl}/`, { content: "after the image store filled" });
    assert.equal(job.status, 200);
  });
});

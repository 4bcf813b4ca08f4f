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
import { ApiError } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { postJson, startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
let svc: TestService;

before(async () => {
  svc = await startService(defer);
});

/** An image store as the microVM host opens it: its own NATS user, its own cache directory. */
async function openStore(options: Parameters<typeof ImageStore.open>[2]) {
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
    assert.match(err.message!, /you store 3 image versions \(old versions count\), the most allowed is 3/);
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
    assert.match(err.message!, /take 6000 bytes \(old versions count\)/);
    await push(images, "frank", "small", moduleOf(3_000));
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

// The snapshot store against a real nats-server with JetStream: a checkpoint image stored and
// read back byte for byte (a real gVisor checkpoint restores from it), per owner and instance;
// a missing, replaced or damaged object is a SnapshotError; the owner's quota counts its bytes;
// room is reserved before a save and counted by the next; unpacking refuses hostile archives
// (names, sizes, an archive past its bound, one cut short) and reads in chunks.
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Objm } from "@nats-io/obj";
import { connectNats, openBuckets, provisionBuckets, snapshotObjectBucket } from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
import {
  SnapshotError,
  SnapshotQuotaExceeded,
  SnapshotStore,
  type SnapshotStoreOptions,
} from "../vm-runtime/snapshots/store.ts";
import { packSnapshot, SnapshotArchiveError, unpackSnapshot } from "../vm-runtime/snapshots/archive.ts";
import { createGvisorProvider } from "../vm-runtime/service/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";
import { rpc } from "./helpers/instance-rpc.ts";
import { testImages } from "./images/paths.ts";
import { gvisorSkip } from "./helpers/providers.ts";

const defer = lifo(after);
// Asked first: with REQUIRE_GVISOR=1 a machine without runsc fails the file before any test runs.
const skipGvisor = await gvisorSkip();

async function tempDir(prefix = "snapshot-store-"): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  defer(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

async function openStore(nats: TestNats, options: Partial<SnapshotStoreOptions> = {}): Promise<SnapshotStore> {
  const provisioner = await connectNats({ ...nats.login("provision"), name: "test-snapshot-provision" });
  await SnapshotStore.provision(provisioner.nc, options);
  await provisionBuckets(provisioner.nc, { only: ["images"] });
  await provisioner.close();
  const handle = await connectNats({ ...nats.login("microvms"), name: "test-snapshot-store" });
  defer(() => handle.close());
  const { images } = await openBuckets(handle.nc, { only: ["images"] });
  return SnapshotStore.open(handle.nc, { kv: images, ...options });
}

/** The bytes of an archive, as chunks of `size`. */
async function* chunked(bytes: Buffer, size = 7): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < bytes.length; at += size) yield bytes.subarray(at, at + size);
}

async function packedBytes(dir: string): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const chunk of (await packSnapshot(dir)).chunks) parts.push(chunk);
  return Buffer.concat(parts);
}

/** An image directory like a checkpoint's: a large incompressible file and the host's small one. */
async function imageDir(bytes = 200_000): Promise<string> {
  const dir = await tempDir();
  await writeFile(join(dir, "checkpoint.img"), randomBytes(bytes));
  await writeFile(join(dir, "microvm-instance.json"), JSON.stringify({ format: 1 }));
  return dir;
}

async function filesOf(dir: string): Promise<Record<string, string>> {
  const files: Record<string, string> = {};
  for (const name of (await readdir(dir)).sort()) files[name] = (await readFile(join(dir, name))).toString("base64");
  return files;
}

describe("snapshot store", () => {
  it("snapshot store - a stored image reads back byte for byte, only under its owner and instance", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats);
    const dir = await imageDir();
    const stored = await store.save("alice", "vm-1", dir);
    assert.match(stored.digest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(await store.bytesOf("alice"), stored.bytes);
    const out = await tempDir();
    await store.load("alice", "vm-1", stored, out);
    assert.deepEqual(await filesOf(out), await filesOf(dir));
    // Another owner, or another instance of the same owner, has no such snapshot.
    await assert.rejects(store.load("bob", "vm-1", stored, await tempDir()), /snapshot of vm-1 is missing/);
    await assert.rejects(store.load("alice", "vm-2", stored, await tempDir()), /snapshot of vm-2 is missing/);
    assert.equal(await store.bytesOf("bob"), 0);
  });

  it("snapshot store - a deleted, replaced or damaged object is a SnapshotError", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats);
    const stored = await store.save("alice", "vm-damaged", await imageDir());
    const admin = await connectNats({ ...nats.login("admin"), name: "test-snapshot-admin" });
    defer(() => admin.close());
    const objects = await new Objm(admin.nc).create(snapshotObjectBucket);
    const name = `${nameToken("alice")}/${nameToken("vm-damaged")}`;
    // Another image put in its place: a valid object, but not the one the record names.
    await objects.putBlob({ name }, await packedBytes(await imageDir(1000)));
    await assert.rejects(
      store.load("alice", "vm-damaged", stored, await tempDir()),
      (error: unknown) => error instanceof SnapshotError && /does not match the digest/.test(error.message),
    );
    // Garbage whose digest the record names: it does not unpack.
    const garbage = randomBytes(5000);
    await objects.putBlob({ name }, garbage);
    const { createHash } = await import("node:crypto");
    const garbageDigest = `sha256:${createHash("sha256").update(garbage).digest("hex")}`;
    await assert.rejects(
      store.load("alice", "vm-damaged", { digest: garbageDigest }, await tempDir()),
      (error: unknown) => error instanceof SnapshotError && /is damaged/.test(error.message),
    );
    await store.delete("alice", "vm-damaged");
    await assert.rejects(
      store.load("alice", "vm-damaged", stored, await tempDir()),
      (error: unknown) => error instanceof SnapshotError && /is missing/.test(error.message),
    );
    await store.delete("alice", "vm-damaged");
    assert.equal(await store.bytesOf("alice"), 0);
  });

  it("snapshot store - the owner's snapshots count against its quota; replacing one's own does not double it", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats, { quotaBytes: 500_000 });
    const first = await store.save("carol", "vm-a", await imageDir(200_000));
    const again = await store.save("carol", "vm-a", await imageDir(200_000));
    assert.equal(await store.bytesOf("carol"), again.bytes, "the new snapshot replaced the old");
    await store.save("carol", "vm-b", await imageDir(200_000));
    await assert.rejects(store.save("carol", "vm-c", await imageDir(200_000)), SnapshotQuotaExceeded);
    await assert.rejects(
      store.load("carol", "vm-c", first, await tempDir()),
      /missing/,
      "nothing stored past the quota",
    );
    // Another owner has a quota of its own.
    await store.save("dave", "vm-c", await imageDir(200_000));
  });

  it("snapshot store - a save reserves its room first: a second save that does not fit is refused before it runs", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats, { quotaBytes: 500_000 });
    let ran = false;
    await store.reserving("erin", "vm-a", 300_000, async () => {
      await assert.rejects(
        store.reserving("erin", "vm-b", 300_000, async () => {
          ran = true;
        }),
        (error: unknown) =>
          error instanceof SnapshotQuotaExceeded &&
          error.quota === 500_000 &&
          /your snapshots take 0\.3 MiB \(300000 bytes\) of your snapshot quota/.test(error.message),
      );
      // A save larger than the reservations of others leave room for is refused too.
      await assert.rejects(store.save("erin", "vm-c", await imageDir(250_000)), SnapshotQuotaExceeded);
    });
    assert.equal(ran, false, "the refused work never ran");
    // Released: both fit one after the other.
    await store.reserving("erin", "vm-b", 300_000, async () => undefined);
  });

  it("snapshot store - an archive of incompressible bytes counts in full (nothing is compressed)", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats);
    const dir = await tempDir();
    await writeFile(join(dir, "pages.img"), Buffer.alloc(3 << 20, 7));
    const stored = await store.save("frank", "vm-zeros", dir);
    assert.ok(stored.bytes > 3 << 20, `${stored.bytes} bytes stored for 3 MiB of one byte`);
  });

  it("snapshot store - unpacking refuses names out of the directory, links, duplicates, a bound passed and an end cut short", async () => {
    const header = "microvm-snapshot 2\n";
    const archive = (body: string) => chunked(Buffer.from(header + body));
    for (const [body, why] of [
      ["../escape\t2\nhi", "a parent path"],
      ["a/b\t2\nhi", "a subdirectory"],
      ["ok\t2\nhiok\t2\nhi", "a duplicate name"],
      ["ok\t200\nhi", "a size past the end"],
      ["ok\t-1\nhi", "a negative size"],
      ["ok", "a header cut short"],
    ] as const) {
      const dir = await tempDir();
      await assert.rejects(unpackSnapshot(archive(body), dir, 1 << 20), SnapshotArchiveError, why);
    }
    const other = await tempDir();
    await assert.rejects(
      unpackSnapshot(chunked(Buffer.from("microvm-snapshot 1\nok\t2\nhi")), other, 1 << 20),
      SnapshotArchiveError,
      "another format",
    );
    assert.deepEqual(await readdir(other), [], "nothing written for another format");
    const dir = await tempDir();
    await symlink("/etc/passwd", join(dir, "linked"));
    await assert.rejects(
      unpackSnapshot(archive("linked\t2\nhi"), dir, 1 << 20),
      /EEXIST/,
      "a planted link is not followed",
    );
    const big = Buffer.concat([Buffer.from(`${header}big\t${4 << 20}\n`), Buffer.alloc(4 << 20)]);
    await assert.rejects(unpackSnapshot(chunked(big, 65536), await tempDir(), 1 << 20), SnapshotArchiveError);
    const source = await tempDir();
    await symlink("/etc/passwd", join(source, "checkpoint.img"));
    await assert.rejects(packSnapshot(source), SnapshotArchiveError, "a link in the image is not packed");
  });

  it("snapshot store - packing and unpacking in chunks of any size give back the same files, empty ones too", async () => {
    const source = await imageDir(30_001);
    await writeFile(join(source, "empty.img"), "");
    const bytes = await packedBytes(source);
    assert.equal(bytes.length, (await packSnapshot(source)).bytes, "the size is known before reading");
    for (const size of [1, 5, 4096, bytes.length]) {
      const out = await tempDir();
      await unpackSnapshot(chunked(bytes, size), out, 1 << 20);
      assert.deepEqual(await filesOf(out), await filesOf(source), `chunks of ${size}`);
    }
  });
});

describe("snapshot store with gVisor", { skip: skipGvisor }, () => {
  it("snapshot store - a real checkpoint stored, deleted on the host and loaded back restores with its state", async () => {
    const nats = await testNats(defer);
    const store = await openStore(nats);
    const provider = await createGvisorProvider({
      hostKey: `snapshot-store-test-${process.pid}`,
      memoryMiB: 96,
      scratchMiB: 8,
      totalMemoryMiB: 1024,
      warmInstances: 0,
    });
    defer(() => provider.close());
    const handle = await provider.start({ microvmId: "vm-real", image: testImages.counter });
    for (let i = 0; i < 5; i++) await rpc(handle, "increment");
    const saved = await rpc(handle, "read");
    const image = await tempDir();
    await provider.checkpoint!(handle, image);
    const stored = await store.save("alice", "vm-real", image);
    await rm(image, { recursive: true });
    const loaded = await tempDir();
    await store.load("alice", "vm-real", stored, loaded);
    const restored = await provider.restore!({ microvmId: "vm-real" }, loaded);
    defer(() => provider.terminate(restored, 200));
    assert.deepEqual(await rpc(restored, "read"), saved);
    console.log(`# counter image snapshot: ${stored.bytes} bytes stored`);
  });
});

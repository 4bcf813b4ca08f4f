// The image store against a real nats-server: a push racing a delete of the same name leaves
// no record without its object and no object without its record; modules are read with no
// consumer, those nats.js's object store API wrote included, and an object whose chunks do not
// match its meta is refused; the host's module cache stays in its bound, evicting least
// recently used modules no instance holds.
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { ImageStore, digestOf, type ImageRecord } from "../vm-runtime/registry/store.ts";
import { ModuleCache } from "../vm-runtime/registry/module-cache.ts";
import { connectNats, imageObjectBucket, type NatsHandle } from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats, type TestRole } from "./helpers/nats.ts";

const defer = lifo(after);
const KiB = 1024;

async function tempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  defer(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

async function login(nats: TestNats, role: TestRole): Promise<NatsHandle> {
  const handle = await connectNats({ ...nats.login(role), name: `test-image-store-${role}` });
  defer(() => handle.close());
  return handle;
}

async function openStore(nats?: TestNats): Promise<ImageStore> {
  const server = nats ?? (await testNats(defer));
  await ImageStore.provision((await login(server, "provision")).nc);
  const handle = await login(server, "microvms");
  return ImageStore.open(handle.nc, await tempDir("image-store-"));
}

const recordOf = (owner: string, name: string, module: Uint8Array): ImageRecord => ({
  name,
  digest: digestOf(module),
  methods: [{ name: "greet" }],
  createdAt: new Date().toISOString(),
  owner,
});

/** Every version record has its object, every object its version record, latest a version. */
async function assertConsistent(store: ImageStore, owner: string, name: string, round: number): Promise<void> {
  const latest = await store.latest(owner, name);
  const objects = await store.objectsOf(owner, name);
  const hexes = objects.map((object) => object.slice(object.lastIndexOf("/") + 1)).sort();
  const versions = (await Promise.all(hexes.map((hex) => store.version(owner, name, `sha256:${hex}`)))).filter(Boolean);
  assert.equal(
    versions.length,
    objects.length,
    `round ${round}: an object without its version record (${objects.join(", ")})`,
  );
  if (latest) {
    assert.ok(await store.stored(latest), `round ${round}: latest ${latest.digest} names a missing object`);
    assert.ok(await store.version(owner, name, latest.digest), `round ${round}: latest has no version record`);
  } else {
    assert.deepEqual(objects, [], `round ${round}: objects left after the delete`);
  }
}

describe("image store", () => {
  it("image store - pushes racing deletes of the same name leave records and objects consistent", async (t) => {
    const store = await openStore();
    const outcomes = new Set<string>();
    for (let round = 0; round < 12; round++) {
      const modules = [0, 1].map((n) => Buffer.from(`export default ${round * 10 + n};`));
      const settled = await Promise.allSettled([
        store.register(recordOf("alice", "racy", modules[0]!), modules[0]!),
        store.delete("alice", "racy", async () => undefined),
        store.register(recordOf("alice", "racy", modules[1]!), modules[1]!),
      ]);
      for (const result of settled)
        assert.equal(result.status, "fulfilled", String((result as PromiseRejectedResult).reason));
      outcomes.add((await store.latest("alice", "racy")) ? "kept" : "deleted");
      await assertConsistent(store, "alice", "racy", round);
    }
    await store.delete("alice", "racy", async () => undefined);
    await assertConsistent(store, "alice", "racy", -1);
    // Which way the races went is reported, not asserted: either is right (checked each round).
    t.diagnostic(`outcomes: ${[...outcomes].join(", ")}`);
  });

  it("image store - a refused delete changes nothing; another name with the same module keeps its object", async () => {
    const store = await openStore();
    const module = Buffer.from("export default 'shared';");
    await store.register(recordOf("alice", "one", module), module);
    await store.register(recordOf("alice", "two", module), module);
    await assert.rejects(
      store.delete("alice", "one", async () => Promise.reject(new Error("in use"))),
      /in use/,
    );
    assert.ok(await store.latest("alice", "one"));
    await store.delete("alice", "one", async () => undefined);
    const two = (await store.latest("alice", "two"))!;
    assert.ok(await store.stored(two), "deleting one name leaves another name's object");
    assert.deepEqual(await store.objectsOf("alice", "one"), []);
  });

  it("image store - a launch that checks during a delete waits for it: refused, it launches; done, it gives way", async () => {
    const store = await openStore();
    const module = Buffer.from("export default 'launch';");
    const record = await store.register(recordOf("alice", "launching", module), module);
    assert.equal(await store.launchable(record), true);
    // Refused (an instance uses it): the waiting launch goes ahead.
    let waiting: Promise<boolean> | undefined;
    await assert.rejects(
      store.delete("alice", "launching", async () => {
        waiting = store.launchable(record);
        await new Promise((resolve) => setTimeout(resolve, 50));
        throw new Error("in use");
      }),
      /in use/,
    );
    assert.equal(await waiting, true, "the delete was refused: the launch goes ahead");
    // Done: the waiting launch gives way.
    let answeredDuringDelete = false;
    await store.delete("alice", "launching", async () => {
      waiting = store.launchable(record);
      void waiting.then(() => (answeredDuringDelete = true));
      await new Promise((resolve) => setTimeout(resolve, 50));
    });
    assert.equal(answeredDuringDelete, false, "the launch did not answer while the delete held the name");
    assert.equal(await waiting, false, "the delete went through: the launch gives way");
    assert.equal(await store.launchable(record), false, "and after it");
    assert.equal(await store.fetch(record), undefined, "its module is gone from the object store");
  });
});

describe("image store - objects read with no consumer", () => {
  /** The object name the store gives `record`'s module (the stored layout, a contract). */
  const objectNameOf = (record: ImageRecord) =>
    `${nameToken(record.owner)}/${record.name}/${record.digest.slice("sha256:".length)}`;
  /** A module of about `kib` KiB: several 128 KiB chunks in the object store. */
  const bigModule = (kib: number, fill = "x") =>
    Buffer.from(`export default ${JSON.stringify(fill.repeat(kib * KiB))};`);

  /** nats.js's own object store API, as the test's admin (who may do anything). */
  async function asAdmin(nats: TestNats) {
    const { nc } = await login(nats, "admin");
    return {
      objects: await new Objm(nc).create(imageObjectBucket),
      jsm: await jetstreamManager(nc),
      js: jetstream(nc),
    };
  }
  type Admin = Awaited<ReturnType<typeof asAdmin>>;
  const stream = `OBJ_${imageObjectBucket}`;

  it("image store - reads a module of several chunks that nats.js's object store API wrote, in a store made without direct gets", async () => {
    const nats = await testNats(defer);
    const { objects, jsm } = await asAdmin(nats);
    const { config } = await jsm.streams.info(stream);
    await jsm.streams.update(stream, { ...config, allow_direct: false });
    const module = bigModule(300);
    const record = recordOf("alice", "big", module);
    const written = await objects.putBlob({ name: objectNameOf(record) }, module);
    assert.equal(written.chunks, 3, "the module is stored in several chunks");

    const store = await openStore(nats);
    assert.equal((await jsm.streams.info(stream)).config.allow_direct, true, "opening the store turns direct gets on");
    const held = await store.fetch(record);
    assert.ok(held, "the module is found");
    assert.ok((await readFile(held.path)).equals(module), "the module arrives whole");
    held.release();
    assert.deepEqual(await store.objectsOf("alice", "big"), [objectNameOf(record)]);
    const ownModule = bigModule(200, "y");
    const own = await store.register(recordOf("alice", "own", ownModule), ownModule);
    const read = await objects.getBlob(objectNameOf(own));
    assert.ok(read && Buffer.from(read).equals(ownModule), "and nats.js reads what the store wrote");
  });

  /** Fetches a registered module after the admin changed its stored object with `change`. */
  async function fetchTampered(change: (admin: Admin, name: string, module: Buffer) => Promise<void>) {
    const nats = await testNats(defer);
    const store = await openStore(nats);
    const module = bigModule(300);
    const record = await store.register(recordOf("alice", "tampered", module), module);
    await change(await asAdmin(nats), objectNameOf(record), module);
    return store.fetch(record);
  }

  /** Publishes `name`'s meta again with `fields` changed; its chunks stay as they are. */
  async function rewriteMeta({ objects, js }: Admin, name: string, fields: Record<string, unknown>) {
    const info = (await objects.info(name))!;
    const { bucket, nuid, size, chunks, digest, mtime } = info;
    const hdrs = headers();
    hdrs.set("Nats-Rollup", "sub");
    const token = Buffer.from(name).toString("base64").replace(/\+/g, "-").replace(/\//g, "_");
    const meta = { name, bucket, nuid, size, chunks, digest, mtime, options: info.options, ...fields };
    await js.publish(`$O.${bucket}.M.${token}`, JSON.stringify(meta), { headers: hdrs });
  }

  it("image store - a module whose chunks do not match the meta's digest is refused", async () => {
    const other = `SHA-256=${createHash("sha256").update("other").digest("base64url")}=`;
    await assert.rejects(
      fetchTampered((admin, name) => rewriteMeta(admin, name, { digest: other })),
      /does not match its digest/,
    );
  });

  it("image store - a module whose chunks do not add up to the meta's size is refused", async () => {
    await assert.rejects(
      fetchTampered((admin, name, module) => rewriteMeta(admin, name, { size: module.byteLength - 1 })),
      /more than its \d+ bytes/,
    );
    await assert.rejects(
      fetchTampered((admin, name, module) => rewriteMeta(admin, name, { size: module.byteLength + 1 })),
      /has \d+ of its \d+ bytes/,
    );
  });

  it("image store - a module that lost a chunk is refused", async () => {
    await assert.rejects(
      fetchTampered(async ({ objects, jsm }, name) => {
        const info = (await objects.info(name))!;
        assert.equal((await jsm.streams.getMessage(stream, { seq: 2 }))?.subject, `$O.${info.bucket}.C.${info.nuid}`);
        await jsm.streams.deleteMessage(stream, 2);
      }),
      /lacks chunk 3 of 3/,
    );
  });
});

describe("module cache", () => {
  async function fill(
    cache: ModuleCache,
    name: string,
    size: number,
  ): Promise<{ digest: string; release: () => void }> {
    const digest = digestOf(Buffer.from(name));
    const release = cache.pin(digest);
    await writeFile(cache.path(digest), Buffer.alloc(size, 1));
    cache.added(digest, size);
    return { digest, release };
  }

  it("module cache - stays within its bound, evicting least recently used modules no one holds", async () => {
    const cache = await ModuleCache.open(await tempDir("module-cache-"), 300 * KiB);
    const a = await fill(cache, "a", 100 * KiB);
    a.release();
    const b = await fill(cache, "b", 100 * KiB);
    b.release();
    const c = await fill(cache, "c", 100 * KiB);
    c.release();
    cache.touch(a.digest); // a is now more recent than b
    const d = await fill(cache, "d", 100 * KiB);
    assert.deepEqual(cache.digests(), [c.digest, a.digest, d.digest], "b, the least recently used, went first");
    assert.equal(existsSync(cache.path(b.digest)), false, "and its file with it");
    assert.ok(cache.bytes <= 300 * KiB);
    d.release();
  });

  it("module cache - a held module is never evicted, even past the bound; it goes once released", async () => {
    const cache = await ModuleCache.open(await tempDir("module-cache-"), 150 * KiB);
    const held = await fill(cache, "held", 100 * KiB);
    const other = await fill(cache, "other", 100 * KiB);
    other.release();
    assert.deepEqual(cache.digests(), [held.digest], "the idle one went; the held one stays");
    const big = await fill(cache, "big", 200 * KiB);
    assert.ok(
      existsSync(cache.path(held.digest)) && existsSync(cache.path(big.digest)),
      "held modules stay past the bound",
    );
    held.release();
    assert.equal(existsSync(cache.path(held.digest)), false, "released past the bound, it goes");
    big.release();
    assert.equal(cache.bytes, 0, "a module larger than the bound is not kept once released");
  });

  it("module cache - a restarted host counts what an earlier run left, within the bound", async () => {
    const dir = await tempDir("module-cache-");
    const first = await ModuleCache.open(dir, 1024 * KiB);
    for (const name of ["x", "y", "z"]) (await fill(first, name, 100 * KiB)).release();
    const second = await ModuleCache.open(dir, 250 * KiB);
    assert.equal(second.digests().length, 2, "the oldest module was evicted to fit the new bound");
    assert.equal(second.bytes, 200 * KiB);
  });
});

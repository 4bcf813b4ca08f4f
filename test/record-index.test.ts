// Record indexes (platform/record-index.ts, actors/pages.ts) against a real nats-server: a walk
// lists a collection in creation order, each record that lived through it once, while records
// are updated, created and deleted; stale entries (a create cut between its two writes, a
// record naming another entry) are skipped, then removed; counts after creates and deletes.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createIndexed, deleteIndexed, listIndexed, STALE_ENTRY_GRACE_MS } from "../actors/pages.ts";
import { readEntry } from "../actors/records.ts";
import {
  collectionSubject,
  connectNats,
  provisionBuckets,
  recordIndex,
  recordStore,
  type NatsHandle,
  type RecordIndex,
  type RecordStore,
} from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);
let client: NatsHandle;
let index: RecordIndex;
let store: RecordStore;

before(async () => {
  const nats = await testNats(defer, { private: true });
  client = await connectNats({ ...nats.login("admin"), name: "test:record-index" });
  defer(() => client.close());
  await provisionBuckets(client.nc, { only: ["tasks"] });
  index = recordIndex(client.requester, "tasks");
  store = recordStore(client.requester, "tasks");
});

const collection = (prefix: string) => collectionSubject("tasks", prefix);
const read = (key: string) => readEntry<{ id: string }>(store, key, () => undefined);

/** Every id of `prefix`'s collection, page by page of `limit`, running `between` after each page. */
async function walk(prefix: string, limit: number, between?: (page: number) => Promise<void>) {
  const ids: string[] = [];
  let cursor: string | undefined;
  for (let page = 0; ; page++) {
    const got = await listIndexed(index, collection(prefix), { limit, cursor }, read);
    assert.ok(got.items.length <= limit);
    ids.push(...got.items.map((item) => item.id));
    if (got.cursor === undefined) return ids;
    cursor = got.cursor;
    await between?.(page);
  }
}

const create = async (prefix: string, id: string) => {
  const key = prefix + id;
  const outcome = await createIndexed(index, collection(prefix), key, (entry) =>
    store.create(key, JSON.stringify({ id }), entry),
  );
  assert.notEqual(outcome, "exists");
  return outcome === "exists" ? { revision: 0, index: 0 } : outcome;
};

describe("record index", () => {
  it("record index - a walk lists each record once in creation order while records change, come and go", async () => {
    const prefix = "walk.";
    const first = Array.from({ length: 40 }, (_, i) => `r${String(i).padStart(2, "0")}`);
    const written = new Map<string, { revision: number; index: number }>();
    // Created in an order that is not key order.
    for (const id of [...first].reverse()) written.set(id, await create(prefix, id));
    const doomed = new Set(["r05", "r06", "r33"]);
    const seen = await walk(prefix, 7, async (page) => {
      // Every record updated (naming its entry still), some created, some deleted.
      for (const id of first) {
        if (doomed.has(id)) continue;
        const { revision, index: entry } = written.get(id)!;
        const moved = await store.update(prefix + id, JSON.stringify({ id, page }), revision, undefined, entry);
        assert.notEqual(moved, "moved");
        if (moved !== "moved") written.set(id, { revision: moved.revision, index: entry });
      }
      await create(prefix, `new${page}`);
      if (page === 1) {
        for (const id of doomed) {
          const { revision, index: entry } = written.get(id)!;
          assert.notEqual(await deleteIndexed(index, entry, () => store.delete(prefix + id, revision)), "moved");
        }
      }
    });
    const lived = [...first].reverse().filter((id) => !doomed.has(id));
    assert.deepEqual(
      seen.filter((id) => !id.startsWith("new") && !doomed.has(id)),
      lived,
      "every record that lived through the walk, once, in creation order",
    );
    assert.equal(new Set(seen).size, seen.length, "a record listed twice");
  });

  it("record index - a create is once, a delete removes its entry, counts follow both", async () => {
    const prefix = "count.";
    const a = await create(prefix, "a");
    await create(prefix, "b");
    await create(prefix, "c");
    const again = await createIndexed(index, collection(prefix), `${prefix}a`, (entry) =>
      store.create(`${prefix}a`, "{}", entry),
    );
    assert.equal(again, "exists");
    assert.equal(await index.count(collection(prefix)), 3, "the refused create's entry is removed");
    assert.equal(await deleteIndexed(index, a.index, () => store.delete(`${prefix}a`, a.revision + 100)), "moved");
    assert.notEqual(await deleteIndexed(index, a.index, () => store.delete(`${prefix}a`, a.revision)), "moved");
    assert.equal(await index.count(collection(prefix)), 2, "right after the delete");
    assert.deepEqual(await walk(prefix, 10), ["b", "c"]);
    assert.equal(await index.count(collection("none.")), 0);
  });

  it("record index - stale entries are skipped (a page may be short and have a cursor), then removed when old", async (t) => {
    const prefix = "stale.";
    await create(prefix, "a");
    // A create cut between its two writes: an entry, no record.
    await index.add(collection(prefix), `${prefix}lost`);
    // A record whose entry was written twice (a run cut after the first): it names the second.
    const b = await create(prefix, "b");
    await index.add(collection(prefix), `${prefix}b`);
    await create(prefix, "c");
    const first = await listIndexed(index, collection(prefix), { limit: 2 }, read);
    assert.deepEqual(
      first.items.map((i) => i.id),
      ["a"],
    );
    assert.ok(first.cursor, "a short page still has a cursor");
    assert.deepEqual(await walk(prefix, 2), ["a", "b", "c"], "each record once");
    assert.ok(b.index > 0);
    assert.equal(await index.count(collection(prefix)), 5, "stale entries count until removed");
    // Past the grace period the walk that finds them removes them.
    const now = Date.now();
    t.mock.method(Date, "now", () => now + STALE_ENTRY_GRACE_MS + 1_000);
    assert.deepEqual(await walk(prefix, 10), ["a", "b", "c"]);
    t.mock.restoreAll();
    const deadline = now + 5_000;
    while ((await index.count(collection(prefix))) !== 3) {
      assert.ok(Date.now() < deadline, "stale entries still there");
      await new Promise((r) => setTimeout(r, 20));
    }
  });

  it("record index - a cursor of another collection or of the previous release is refused", async () => {
    await create("one.", "x");
    await create("one.", "y");
    const page = await listIndexed(index, collection("one."), { limit: 1 }, read);
    assert.ok(page.cursor);
    const refused = (err: unknown) => (err as { _tag?: string })._tag === "HttpApiDecodeError";
    await assert.rejects(listIndexed(index, collection("two."), { limit: 1, cursor: page.cursor }, read), refused);
    // The previous release's cursor: the last key a page looked at.
    const previous = Buffer.from("one.x").toString("base64url");
    await assert.rejects(listIndexed(index, collection("one."), { limit: 1, cursor: previous }, read), refused);
  });
});

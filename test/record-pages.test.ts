// Record pages (platform/record-pages.ts) against a real nats-server: a walk lists a collection in creation order, each record that lived
// through it once, while records are updated (moved to the stream's end), created and deleted;
// the walk of a collection sparse in its stream (read filtered) as of a dense one; counts exact
// right after deletes and after the server drops the deletions' tombstones.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import {
  connectNats,
  markerKey,
  openBuckets,
  recordPages,
  recordStore,
  type NatsHandle,
  type RecordPages,
} from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);
let client: NatsHandle;
let pages: RecordPages;

before(async () => {
  const nats = await testNats(defer, { private: true });
  client = await connectNats({ ...nats.login("admin"), name: "test:record-pages" });
  defer(() => client.close());
  await openBuckets(client.nc, { only: ["tasks"] });
  pages = recordPages(client.requester, "tasks");
});

/** Every marker of `prefix`'s collection, page by page of `limit`, running `between` after each page. */
async function walk(prefix: string, limit: number, between?: (page: number) => Promise<void>) {
  const tokens: string[] = [];
  let after = 0;
  for (let page = 0; ; page++) {
    const got = await pages.page(prefix, "c", after, limit);
    assert.ok(got.markers.length <= limit);
    tokens.push(...got.markers.map((m) => m.token));
    if (!got.more) return tokens;
    assert.equal(got.markers.length, limit, "a page with more after it is full");
    after = got.markers.at(-1)!.seq;
    await between?.(page);
  }
}

const create = async (prefix: string, token: string) => {
  const outcome = await pages.create(prefix, token, JSON.stringify({ id: token }));
  assert.notEqual(outcome, "exists");
  return outcome === "exists" ? 0 : outcome.revision;
};

describe("record pages", () => {
  it("record pages - a walk lists each record once in creation order while records move, come and go", async () => {
    const prefix = "walk.";
    const first = Array.from({ length: 40 }, (_, i) => `r${String(i).padStart(2, "0")}`);
    const revisions = new Map<string, number>();
    // Created in an order that is not key order.
    for (const token of [...first].reverse()) revisions.set(token, await create(prefix, token));
    const store = recordStore(client.requester, "tasks");
    const doomed = new Set(["r05", "r06", "r33"]);
    const seen = await walk(prefix, 7, async (page) => {
      // Every record updated (its message moves past the walk), some created, some deleted.
      for (const token of first) {
        if (doomed.has(token)) continue;
        const moved = await store.update(prefix + token, `{"page":${page}}`, revisions.get(token)!);
        assert.notEqual(moved, "moved");
        if (moved !== "moved") revisions.set(token, moved.revision);
      }
      await create(prefix, `new${page}`);
      if (page === 1) {
        for (const token of doomed) assert.notEqual(await pages.delete(prefix, token, revisions.get(token)!), "moved");
      }
    });
    const lived = [...first].reverse().filter((t) => !doomed.has(t));
    assert.deepEqual(
      seen.filter((t) => !t.startsWith("new") && !doomed.has(t)),
      lived,
      "every record that lived through the walk, once, in creation order",
    );
    assert.equal(new Set(seen).size, seen.length, "a record listed twice");
  });

  it("record pages - create is once, delete names the revision, counts are exact after each", async () => {
    const prefix = "count.";
    const a = await create(prefix, "a");
    await create(prefix, "b");
    await create(prefix, "c");
    assert.equal(await pages.create(prefix, "a", "{}"), "exists");
    assert.equal(await pages.count(prefix), 3);
    assert.equal(await pages.delete(prefix, "a", a + 100), "moved");
    assert.notEqual(await pages.delete(prefix, "a", a), "moved");
    assert.equal(await pages.count(prefix), 2, "right after the delete");
    assert.equal(await recordStore(client.requester, "tasks").get(`${prefix}a`), undefined);
    // The server drops the tombstone and the note: the count stays, and nothing of `a` is left.
    const jsm = await jetstreamManager(client.nc);
    const gone = [markerKey(prefix, "c", "a"), markerKey(prefix, "d", "a")].map((k) => `$KV.tasks.${k}`);
    const left = async () =>
      Object.keys(
        (await jsm.streams.info("KV_tasks", { subjects_filter: `$KV.tasks.${prefix}>` })).state.subjects ?? {},
      ).filter((s) => gone.includes(s));
    assert.equal((await left()).length, 2, "a tombstone and a note until the server drops them");
    const deadline = Date.now() + 10_000;
    while ((await left()).length > 0) {
      assert.ok(Date.now() < deadline, `still there: ${await left()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(await pages.count(prefix), 2, "after the server dropped them");
    assert.deepEqual(await walk(prefix, 10), ["b", "c"]);
  });

  it("record pages - a collection sparse in its stream walks as a dense one", async () => {
    const sparse = "sparse.";
    const dense = "dense.";
    const wanted: string[] = [];
    for (let i = 0; i < 30; i++) {
      wanted.push(`s${i}`);
      await create(sparse, `s${i}`);
      // Far more of another collection between each: the unfiltered read runs out of budget.
      await Promise.all(Array.from({ length: 60 }, (_, j) => create(dense, `d${i}-${j}`)));
    }
    assert.deepEqual(await walk(sparse, 4), wanted);
    assert.equal((await walk(dense, 250)).length, 30 * 60);
    assert.equal(await pages.count(sparse), 30);
  });

  it("record pages - a create carrying a fence is refused once the fence key moved", async () => {
    const store = recordStore(client.requester, "tasks");
    const lease = await store.create("fence", "holder");
    assert.notEqual(lease, "exists");
    const revision = lease === "exists" ? 0 : lease.revision;
    const fence = { key: "fence", revision };
    assert.notEqual(await pages.create("f.", "x", "{}", fence), "exists");
    await store.update("fence", "other", revision);
    assert.equal(await pages.create("f.", "y", "{}", fence), "exists");
    assert.equal(await store.get("f.y"), undefined);
    assert.equal(await store.get(markerKey("f.", "c", "y")), undefined, "no marker without its record");
  });
});

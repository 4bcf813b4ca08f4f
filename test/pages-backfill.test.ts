// The backfill of list indexes on a store written by the previous release (records naming no
// index entry, deleted ones among them, names not listed): a run SIGKILLed halfway, then a run
// to the end, lists every live record once and no deleted one, counts each name's tasks, lists
// every name; a later run writes nothing.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { headers } from "@nats-io/transport-node";
import { backfillDoneSubject, backfillIndexes } from "../actors/index.ts";
import { listIndexed } from "../actors/pages.ts";
import { nameTasksCollection, namesCollection } from "../actors/task-object-directory.ts";
import { tasksCollection } from "../actors/tasks.ts";
import {
  connectNats,
  indexStreamOf,
  provisionBuckets,
  recordIndex,
  recordStore,
  type NatsHandle,
} from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";

const defer = lifo(after);
let nats: TestNats;
let client: NatsHandle;

const TASKS = 40_000;
const NAMES = ["alpha", "beta", "gamma"];
const PER_NAME = 300;

before(async () => {
  nats = await testNats(defer, { private: true, anonymous: true });
  client = await connectNats({ servers: nats.url, name: "test:pages-backfill" });
  defer(() => client.close());
});

/** Writes as the previous release did: records only, and KV deletes of some. */
async function previousRelease() {
  await provisionBuckets(client.nc, { only: ["tasks", "taskObjects"] });
  const put = (subject: string, data: string, del = false) => {
    const h = headers();
    if (del) h.set("KV-Operation", "DEL");
    return client.requester.request(subject, data, 10_000, del ? h : undefined);
  };
  const live = new Set<string>();
  for (let i = 0; i < TASKS; i += 2_000) {
    const ids = Array.from({ length: 2_000 }, () => crypto.randomUUID());
    await Promise.all(ids.map((id) => put(`$KV.tasks.${id}`, JSON.stringify({ id, title: "old", completed: false }))));
    for (const id of ids) live.add(id);
  }
  const deleted = [...live].slice(0, 25);
  await Promise.all(deleted.map((id) => put(`$KV.tasks.${id}`, "", true)));
  for (const id of deleted) live.delete(id);
  const perName = new Map<string, number>();
  for (const name of NAMES) {
    const ids = Array.from({ length: PER_NAME }, () => crypto.randomUUID());
    const token = nameToken(name);
    await Promise.all(
      ids.map((id) => put(`$KV.taskobjects.${token}.${id}`, JSON.stringify({ id, title: "o", completed: false }))),
    );
    await Promise.all(ids.slice(0, 10).map((id) => put(`$KV.taskobjects.${token}.${id}`, "", true)));
    perName.set(name, PER_NAME - 10);
  }
  // An active name holding no task: its lease beside the records (one replica).
  await put(`$KV.taskobjects.${nameToken("idle")}`, "{}");
  return { live, perName };
}

/** Every key listed in a collection, walked page by page as the lists walk it. */
async function walk(bucket: string, collection: string) {
  const index = recordIndex(client.requester, bucket);
  const store = recordStore(client.requester, bucket);
  const keys: string[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await listIndexed(index, collection, { limit: 1_000, cursor }, async (key) => {
      const stored = await store.entry(key);
      return stored && { value: key, bucket, key, revision: stored.revision, index: stored.index };
    });
    keys.push(...page.items);
    if (page.cursor === undefined) return keys;
    cursor = page.cursor;
  }
}

describe("pages backfill", () => {
  it("pages backfill - killed halfway and run again, every earlier record is listed once and counted", async () => {
    const { live, perName } = await previousRelease();
    const tasks = recordIndex(client.requester, "tasks");
    const child = spawn(process.execPath, ["--import", "tsx", "test/helpers/backfill-child.ts"], {
      env: { ...process.env, NATS_URL: nats.url },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const exited = once(child, "exit");
    defer(() => {
      if (child.exitCode === null) child.kill("SIGKILL");
    });
    // Killed once its first entries are stored, long before the last (it writes tens of thousands).
    for (;;) {
      const written = await tasks.count(tasksCollection(""));
      if (written > 0) break;
      assert.equal(child.exitCode, null, "the backfill ended before it was seen writing");
      await new Promise((r) => setTimeout(r, 5));
    }
    child.kill("SIGKILL");
    await exited;
    const halfway = await tasks.count(tasksCollection(""));
    assert.ok(halfway < live.size, `killed after ${halfway} of ${live.size} entries`);
    const doneMark = async (bucket: string) => {
      const api = `$JS.API.DIRECT.GET.${indexStreamOf(bucket)}.${backfillDoneSubject(bucket)}`;
      return ((await client.requester.request(api, undefined, 5_000)).headers?.code ?? 0) === 0;
    };
    assert.equal(await doneMark("tasks"), false, "no done mark after a run killed halfway");

    const written = await backfillIndexes(client.requester);
    assert.ok(written > 0 && written <= live.size + NAMES.length * PER_NAME + NAMES.length + 1);
    const listed = await walk("tasks", tasksCollection(""));
    assert.equal(new Set(listed).size, listed.length, "a task listed twice");
    assert.deepEqual(new Set(listed), live, "every live task, no deleted one");
    for (const [name, count] of perName) {
      const collection = nameTasksCollection(nameToken(name));
      assert.equal(await recordIndex(client.requester, "taskobjects").count(collection), count, name);
      assert.equal((await walk("taskobjects", collection)).length, count, name);
    }
    const names = (await walk("taskobjects", namesCollection(""))).map((key) => key.split(".").at(-1));
    assert.deepEqual(new Set(names), new Set([...NAMES, "idle"].map(nameToken)));
    assert.equal(await doneMark("tasks"), true);
    assert.equal(await doneMark("taskobjects"), true);
    assert.equal(await backfillIndexes(client.requester), 0, "a run after the done key writes nothing");
  });
});

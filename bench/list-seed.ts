// The records the list rows read, written straight into KV and the index streams (records and
// entries as the actors write them, many in flight): `count` tasks, and `count` task-object
// tasks, half in the object `big` and the rest spread over 399 others, all 400 names listed.
import { createIndexed } from "../actors/pages.ts";
import { listName, namesCollection, nameTasksCollection } from "../actors/task-object-directory.ts";
import { tasksCollection } from "../actors/tasks.ts";
import { bucketNames, recordIndex, recordStore, type Requester } from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
import { inPool } from "./nats-load.ts";
import { waitForService } from "./seed.ts";

/** Names of the seeded task objects: `big` first. */
export const LISTED_NAMES = ["big", ...Array.from({ length: 399 }, (_, k) => `spread-${k}`)];

/** What was seeded: the index entries of each collection, in order. */
export interface ListSeeds {
  /** Entries of the tasks' collection. */
  tasks: number[];
  /** Entries of `big`'s tasks. */
  big: number[];
  /** Entries of the names' collection. */
  names: number[];
}

const IN_FLIGHT = 512;

/**
 * Seeds `count` tasks and `count` task-object tasks through `requester` (a user that may write
 * both buckets and their indexes), once the service at `taskUrl` answers (its actors made the
 * buckets; the check creates one more task).
 */
export async function seedLists(taskUrl: string, requester: Requester, count: number): Promise<ListSeeds> {
  if (taskUrl) await waitForService(taskUrl);
  const tasks = recordStore(requester, bucketNames.tasks);
  const taskIndex = recordIndex(requester, bucketNames.tasks);
  const objects = recordStore(requester, bucketNames.taskObjects);
  const objectIndex = recordIndex(requester, bucketNames.taskObjects);
  const indexed = async (outcome: Promise<{ index: number } | "exists">) => {
    const done = await outcome;
    if (done === "exists") throw new Error("a seeded key existed");
    return done.index;
  };
  await inPool(LISTED_NAMES.length, 64, (i) => listName(objects, objectIndex, "", nameToken(LISTED_NAMES[i]!)));
  const task = (id: string) => JSON.stringify({ id, title: "bench", completed: false });
  const taskEntries = await inPool(count, IN_FLIGHT, () => {
    const id = crypto.randomUUID();
    return indexed(createIndexed(taskIndex, tasksCollection(""), id, (entry) => tasks.create(id, task(id), entry)));
  });
  const objectEntries = await inPool(count, IN_FLIGHT, async (i) => {
    const name = i % 2 === 0 ? "big" : LISTED_NAMES[1 + ((i >> 1) % (LISTED_NAMES.length - 1))]!;
    const id = crypto.randomUUID();
    const token = nameToken(name);
    const key = `${token}.${id}`;
    const entry = await indexed(
      createIndexed(objectIndex, nameTasksCollection(token), key, (e) => objects.create(key, task(id), e)),
    );
    return { name, entry };
  });
  const names = await objectIndex.page(namesCollection(""), 0, LISTED_NAMES.length);
  return {
    tasks: taskEntries.sort((a, b) => a - b),
    big: objectEntries.flatMap((o) => (o.name === "big" ? [o.entry] : [])).sort((a, b) => a - b),
    names: names.entries.map((e) => e.seq),
  };
}

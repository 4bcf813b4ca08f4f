// The directory of task objects: which names store tasks or are active, how many tasks each
// stores, and which process holds its activation, among the caller's principal's objects. Any
// actor answers from storage (placed stateless): describing or listing one never activates it.
import type { Static } from "@sinclair/typebox";
import {
  bucketNames,
  collectionSubject,
  type RecordIndex,
  type RecordStore,
  type VersionedStore,
} from "../platform/index.ts";
import {
  nameFromToken,
  TaskObjectNotFound,
  taskObjectLeaseKey,
  type TaskObjectInfo,
  type taskObjectDirectoryApi,
} from "../schemas/index.ts";
import { createIndexed, listIndexed } from "./pages.ts";
import { parseLease } from "../placement/index.ts";
import { ownPrefix } from "./records.ts";
import type { ApiHandlers } from "./serve.ts";

type Info = Static<typeof TaskObjectInfo>;

/**
 * The collection of the tasks a task object stores, by its lease key (`taskObjectLeaseKey`:
 * `<name-token>`, or `<owner token>.<name-token>` for a named principal's; records `<that>.<id>`).
 */
export const nameTasksCollection = (object: string): string => collectionSubject(bucketNames.taskObjects, `${object}.`);

/**
 * The collection of one principal's names (by its key prefix, `ownerPrefix`), each listed once, from its first
 * activation on.
 */
export const namesCollection = (prefix: string): string => collectionSubject(bucketNames.taskObjects, prefix, "o");

/**
 * The record that lists a name in its principal's `namesCollection`: `<prefix>=o.=.<name-token>`.
 * `=`-led tokens: no record, lease or change-feed key (`<name-token>.<id>`) is one.
 */
const NAME_KEY_INFIX = "=o.=.";
export const nameListingKey = (prefix: string, token: string): string => prefix + NAME_KEY_INFIX + token;

/** Lists the name `token` of the principal whose keys start with `prefix`, unless it is listed already. */
export async function listName(store: RecordStore, index: RecordIndex, prefix: string, token: string): Promise<void> {
  const key = nameListingKey(prefix, token);
  const listed = await store.entry(key);
  if (listed?.index !== undefined) return;
  await createIndexed(index, namesCollection(prefix), key, (entry) => store.create(key, token, entry));
}

export interface TaskObjectDirectoryDeps {
  /** The task objects' records (bucket `taskobjects`): the names' listing records are read there. */
  records: RecordStore;
  /** The index of `taskobjects`: the names, and the tasks of each. */
  index: RecordIndex;
  /**
   * The task objects' leases (key `taskObjectLeaseKey`): in the same bucket, or `taskobject-leases` (`leaseBucketFor`).
   */
  leases: VersionedStore;
}

/** Names described at once per request (each: a count and a lease read, pipelined on one connection). */
const NAMES_AT_ONCE = 100;
/** What a claimer waits past a silent lease's TTL (placement's margin): a lease unrenewed longer has lapsed. */
const LAPSE_MARGIN_MS = 500;

/**
 * The directory's handlers. The count of a name's tasks comes from storage, not from its owner:
 * an owner holds in memory only the records it read or wrote, and asking it would activate the
 * name. What it costs: one request, the entries of the name's collection in the index (stale
 * ones, of creates cut short, count until a walk removes them); a list page reads the next
 * names from its cursor and describes each, all at once.
 */
export function taskObjectDirectory(deps: TaskObjectDirectoryDeps): ApiHandlers<typeof taskObjectDirectoryApi> {
  const { records, index, leases } = deps;

  /**
   * The live activation of the task object whose lease key is `object`: its holder, and how long
   * it has held the name. None when the key is deleted (released) or its holder stopped renewing
   * it for longer than its TTL (by the server's time of the last renewal against this clock).
   */
  const activation = async (object: string): Promise<Pick<Info, "activeOn" | "leaseAgeMs">> => {
    const entry = await leases.get(object);
    const lease = entry.value && parseLease(entry.value);
    if (!lease) return {};
    const now = Date.now();
    if (entry.time !== undefined && now - entry.time > lease.ttlMs + LAPSE_MARGIN_MS) return {};
    // A lease written before `since` existed: its last renewal is all that is known.
    const since = lease.since ?? entry.time ?? now;
    return { activeOn: lease.owner, leaseAgeMs: Math.max(0, Math.round(now - since)) };
  };

  /** The entry of `name`, whose lease key is `object`, or undefined when it has no task and no activation. */
  const describe = async (name: string, object: string): Promise<Info | undefined> => {
    const [tasks, active] = await Promise.all([index.count(nameTasksCollection(object)), activation(object)]);
    if (tasks === 0 && active.activeOn === undefined) return undefined;
    return { name, tasks, ...active };
  };

  return {
    async getTaskObject({ name }, context) {
      // A name (256 characters at most) and a principal fit in a key.
      const info = await describe(name, taskObjectLeaseKey(name, context.principal)!);
      if (!info) throw TaskObjectNotFound.make({ name });
      return info;
    },
    /**
     * Names in the order they were first activated, a page of the directory at a time. A name
     * that stores no task and is not active is left out, so a page may hold fewer than `limit`.
     */
    async listTaskObjects(input, context) {
      const prefix = ownPrefix(context);
      const names = await listIndexed(index, namesCollection(prefix), input, async (key) => {
        const listed = await records.entry(key);
        const token = key.slice(prefix.length + NAME_KEY_INFIX.length);
        return listed && { value: token, bucket: records.bucket, key, revision: listed.revision, index: listed.index };
      });
      const described = await mapLimited(names.items, NAMES_AT_ONCE, (token) => {
        const name = nameFromToken(token);
        return name === undefined ? undefined : describe(name, prefix + token);
      });
      const items = described.filter((info): info is Info => info !== undefined);
      return names.cursor === undefined ? { items } : { items, cursor: names.cursor };
    },
  };
}

/** `fn` of every item, at most `limit` at a time, in the items' order. */
async function mapLimited<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R> | R): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

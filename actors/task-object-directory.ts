// The directory of task objects: which names store tasks or are active, how many tasks each
// stores, and which process holds its activation, among the caller's principal's objects. Any
// actor answers from storage (placed stateless): describing or listing one never activates it.
import type { Static } from "@sinclair/typebox";
import type { VersionedStore } from "../platform/index.ts";
import {
  decodeFailure,
  hasOwnerToken,
  nameFromToken,
  TaskObjectNotFound,
  taskObjectLeaseKey,
  type getTaskObject,
  type listTaskObjects,
  type TaskObjectInfo,
} from "../schemas/index.ts";
import { parseLease } from "./placement.ts";
import type { Handler } from "./serve.ts";
import { cursorOf, ownPrefix, principalOf } from "./records.ts";
import { pageOf } from "./tasks.ts";

type Info = Static<typeof TaskObjectInfo>;

export interface TaskObjectDirectoryDeps {
  /**
   * The task objects' records (bucket `taskobjects`, keys `<name-token>.<id>`, a named
   * principal's below its owner token), read at the stream leader.
   */
  records: VersionedStore;
  /** The task objects' leases (key `taskObjectLeaseKey`): in the same bucket, or `taskobject-leases` (`leaseBucketFor`). */
  leases: VersionedStore;
}

export interface TaskObjectDirectoryHandlers {
  listTaskObjects: Handler<typeof listTaskObjects>;
  getTaskObject: Handler<typeof getTaskObject>;
}

// Reads in flight per request: names described at once, and record reads at once per name.
const NAMES_AT_ONCE = 8;
const READS_PER_NAME = 64;
/** What a claimer waits past a silent lease's TTL (placement's margin): a lease unrenewed longer has lapsed. */
const LAPSE_MARGIN_MS = 500;

/**
 * The directory's handlers. The count of a name's tasks comes from storage, not from its
 * owner: an owner holds in memory only the records it read or wrote, and asking it would
 * activate the name. What it costs: the name's keys (one stream info request, whose answer
 * grows with the keys ever written under the name, deleted ones included), then one leader read
 * per key, since a deleted key stays listed with its delete marker. So the count is exact after
 * every acknowledged create and delete, at O(keys of the name) reads per described name; a list
 * page also reads every key of the bucket once (stream info) to find the names, as listTasks does.
 */
export function taskObjectDirectory(deps: TaskObjectDirectoryDeps): TaskObjectDirectoryHandlers {
  const { records, leases } = deps;

  /** Tasks stored under `keys`: those whose last write is a record, not a deletion. */
  const countTasks = async (keys: readonly string[]): Promise<number> => {
    const stored = await mapLimited(keys, READS_PER_NAME, async (key) => {
      const entry = await records.get(key);
      return entry.value !== undefined && entry.value.length > 0;
    });
    return stored.filter(Boolean).length;
  };

  /**
   * The live activation of the object whose lease key is `object`: its holder, and how long it
   * has held the name. None when the key is deleted (released) or its holder stopped renewing it
   * for longer than its TTL (by the server's time of the last renewal against this clock).
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
  const describe = async (name: string, object: string, keys: readonly string[]): Promise<Info | undefined> => {
    const [tasks, active] = await Promise.all([countTasks(keys), activation(object)]);
    if (tasks === 0 && active.activeOn === undefined) return undefined;
    return { name, tasks, ...active };
  };

  return {
    async getTaskObject({ name }, context) {
      // A name (256 characters at most) and a principal fit in a key.
      const object = taskObjectLeaseKey(name, principalOf(context))!;
      const info = await describe(name, object, await records.keys(`${object}.`));
      if (!info) throw TaskObjectNotFound.make({ name });
      return info;
    },
    /**
     * Names in the order of their tokens. The next page starts after the last token this one
     * looked at, so a name is on one page at most, however many are created meanwhile, and
     * every name that stores tasks or is active throughout the listing is on one.
     */
    async listTaskObjects(input, context) {
      const { limit, after } = pageOf(input, "");
      if (after !== undefined && nameFromToken(after) === undefined)
        throw decodeFailure(["cursor"], "not a cursor this list answered");
      const owner = ownPrefix(context);
      const keysByToken = await namesAfter(owner, after);
      const tokens = [...keysByToken.keys()].sort();
      const items: Info[] = [];
      let looked = 0;
      while (items.length < limit && looked < tokens.length) {
        const batch = tokens.slice(looked, looked + limit - items.length);
        looked += batch.length;
        const described = await mapLimited(batch, NAMES_AT_ONCE, (token) =>
          describe(nameFromToken(token)!, owner + token, keysByToken.get(token)!),
        );
        for (const info of described) if (info) items.push(info);
      }
      // The cursor `listRecords` gives (`pageOf` reads it back): the last token looked at.
      return looked < tokens.length ? { items, cursor: cursorOf(tokens[looked - 1]!) } : { items };
    },
  };

  /**
   * Every name token after `after` of the principal whose keys start with `owner` (`ownPrefix`)
   * that has a record key or a lease key, with its record keys.
   */
  async function namesAfter(owner: string, after: string | undefined): Promise<Map<string, string[]>> {
    const byToken = new Map<string, string[]>();
    const later = (token: string) =>
      (after === undefined || token > after) && nameFromToken(token) !== undefined ? token : undefined;
    // A lease key is a bare token, a record key a token and an id (both below the owner's
    // prefix): one listing holds both when the leases live beside the records.
    const apart = leases.bucket !== records.bucket;
    const [recordKeys, leaseKeys] = await Promise.all([records.keys(owner), apart ? leases.keys(owner) : []]);
    for (const key of [...recordKeys, ...leaseKeys]) {
      // The anonymous principal's prefix is empty: named principals' keys are not its own.
      if (owner === "" && hasOwnerToken(key)) continue;
      const dot = key.indexOf(".", owner.length);
      const token = later(dot < 0 ? key.slice(owner.length) : key.slice(owner.length, dot));
      if (token === undefined) continue;
      const keys = byToken.get(token) ?? [];
      if (dot > 0) keys.push(key);
      byToken.set(token, keys);
    }
    return byToken;
  }
}

/** `fn` of every item, at most `limit` at a time, in the items' order. */
async function mapLimited<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
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

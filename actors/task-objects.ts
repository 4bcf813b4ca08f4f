// The task-object actor: a stateful object per principal and name (Durable-Object style). Each
// has its own storage (keys `<name-token>.<id>` in the `taskobjects` bucket, a named principal's
// below its owner token: `taskObjectKey`) and at most one live activation across all actor
// processes (placement/): the adapter runs each request at the process holding the object's
// lease, so the handlers here are the owner's side only.
import { LRUCache } from "lru-cache";
import {
  answerStored,
  nameToken,
  StoredAnswer,
  ownedOperations,
  TaskNotFound,
  taskApi,
  taskObjectKey,
  taskObjectLeaseKey,
  type getTaskDO,
} from "../schemas/index.ts";
import {
  type CreateOutcome,
  parseNatsServerVersion,
  recentEnough,
  type RecordIndex,
  type RecordStore,
} from "../platform/index.ts";
import type { Activation, Placement } from "../placement/index.ts";
import { createIndexed, deleteIndexed, listIndexed, type IndexedOutcome } from "./pages.ts";
import { listName, nameTasksCollection } from "./task-object-directory.ts";
import { createRecord, deleteRecord, ownPrefix, readEntry, updateRecord, type Stored } from "./records.ts";
import type { ApiHandlers, Handler } from "./serve.ts";
import { isTaskRecord, taskCondition, type TaskRecord } from "./tasks.ts";

/** The task-object operations: the Task API's operations placed by name. */
export const taskObjectApi = ownedOperations(taskApi);
/** What the owner of a name holds while it runs a request: the name's activation. */
export type TaskObjectStates = { readonly byName: Activation };
/** The owner's side of the task-object operations (the adapter routes each request there first). */
export type TaskObjectHandlers = ApiHandlers<typeof taskObjectApi, TaskObjectStates>;

export interface TaskObjectDeps {
  store: RecordStore;
  /** The index of `taskobjects`: the names, and the tasks of each in creation order. */
  index: RecordIndex;
  placement: Placement;
  /** Records kept in memory for reads (default 50,000; 0: none). Records never change. */
  cacheEntries?: number;
  /**
   * Creates carry their fence (a condition on the lease's revision) instead of a lease write
   * before them (`foldsFences`). Default off.
   */
  fenceInCreate?: boolean;
}

/**
 * Whether a create can carry its fence: the server knows a condition on another key (2.12+),
 * and the leases are kept in the records' own bucket, which `leaseBucketFor` does on one replica
 * only (a replicated stream refuses a second write conditional on the same key while the first
 * is in flight, so there the creates of a busy name would be refused in turn).
 */
export function foldsFences(
  serverVersion: string | undefined,
  leases: { readonly bucket: string },
  records: { readonly bucket: string },
): boolean {
  return leases.bucket === records.bucket && recentEnough(parseNatsServerVersion(serverVersion ?? ""));
}

/**
 * getTaskDO answered from storage alone, in any process (the gateway's local reads). True
 * wherever it runs: a record never changes after its create, is stored before that create is
 * answered, and a store of several replicas confirms a miss with the stream leader; so what
 * the owner would answer (it reads the same key) is answered without waiting for the owner.
 */
export function taskObjectReader(store: RecordStore): Handler<typeof getTaskDO> {
  return async ({ id, name }, context) => {
    const key = taskObjectKey(name ?? "default", id, context.principal);
    const task = key === undefined ? undefined : await readEntry<TaskRecord>(store, key, isTaskRecord);
    if (!task) throw TaskNotFound.make({ id });
    return answerStored(task);
  };
}

/**
 * The owner's side of the task-object operations: reads from this activation's memory or
 * storage, writes fenced by the name's activation. The adapter (`serveApi` with `leasedOwners`)
 * runs them only where the name lives.
 */
export function taskObjectHandlers(deps: TaskObjectDeps): TaskObjectHandlers {
  const { store, index, placement } = deps;
  /**
   * `owner`'s create of a record with a fresh id: one write carrying its fence where the stream
   * allows it, else (or when the server refused it) a fence and then the create-only write.
   */
  const fencedCreate = (owner: Activation, object: string, key: string, data: string, fresh: boolean) =>
    createIndexed(index, nameTasksCollection(object), key, async (entry): Promise<CreateOutcome> => {
      // Only a key no caller chose, on the request's first attempt, can skip the server's check
      // that it is new (`keyFresh`).
      if (deps.fenceInCreate && fresh) {
        const outcome = await placement.carryingFence(owner, (revision) =>
          store.createFenced(key, data, { key: owner.key, revision }, entry),
        );
        if (outcome !== "refused" && outcome !== "busy") return outcome;
        // The lease moved (the fence below then fails), a write of it overtook this one, or its
        // writes kept coming: fence and write as any other write does (the key is new all the same).
      }
      await placement.fence(owner);
      return store.create(key, data, entry);
    });
  // A name is listed (`namesCollection`) from its first activation on: checked once per
  // activation, before its first request runs, so every name that stores a task is listed.
  const named = new WeakSet<Activation>();
  const inDirectory = async (context: { readonly owner: Activation; readonly principal: string }, name: string) => {
    if (named.has(context.owner)) return;
    await listName(store, index, ownPrefix(context), nameToken(name));
    named.add(context.owner);
  };
  // The owner reads its records from memory once seen. Only the activation that kept one uses
  // it: every write of the name goes through that activation, so what it kept is current while
  // it lives; a later activation (here or elsewhere) may have changed it. Absence is never kept.
  const entries = deps.cacheEntries ?? 50_000;
  const records = entries > 0 ? new LRUCache<string, Kept>({ max: entries }) : undefined;
  const keep = (stored: Stored<TaskRecord | null>, owner: Activation) => {
    const kept = records?.get(stored.key);
    // Two answers out of order (a read that began before a write, two writes): the newer stays.
    if (kept?.activation === owner && kept.stored.revision > stored.revision) return;
    records?.set(stored.key, { stored, activation: owner });
  };
  const read = async (key: string, owner: Activation): Promise<Stored<TaskRecord> | undefined> => {
    const kept = records?.get(key);
    // A deletion kept (value null) is an absence this activation knows of.
    if (kept?.activation === owner) return kept.stored.value === null ? undefined : (kept.stored as Stored<TaskRecord>);
    const task = await readEntry<TaskRecord>(store, key, isTaskRecord);
    if (task) keep(task, owner);
    return task;
  };
  return {
    async getTaskDO({ id, name = "default" }, context) {
      await inDirectory(context, name);
      const key = taskObjectKey(name, id, context.principal);
      const task = key === undefined ? undefined : await read(key, context.owner);
      if (!task) throw TaskNotFound.make({ id });
      return answerStored(task);
    },
    async createTaskDO({ title, name = "default" }, context) {
      // The adapter fixed the id before any forward, so a repeated forward creates one record.
      const task: TaskRecord = { id: context.idempotencyKey!, title, completed: false };
      const key = taskObjectKey(name, task.id, context.principal)!;
      await inDirectory(context, name);
      const stored = await createRecord(
        store,
        key,
        task,
        isTaskRecord,
        (s) => s.title === task.title,
        (k, data): Promise<IndexedOutcome> =>
          fencedCreate(context.owner, taskObjectLeaseKey(name, context.principal)!, k, data, context.keyFresh === true),
      );
      // Not kept: most created records are never read at the owner (the gateways read storage),
      // and keeping each one carried it into the old generation. Nothing kept goes stale: a
      // create succeeds only for a key with no write before it, and answers a repeat as stored.
      return answerStored(stored);
    },
    async updateTaskDO({ id, name = "default", ...change }, context) {
      const key = taskObjectKey(name, id, context.principal);
      await Promise.all([placement.fence(context.owner), inDirectory(context, name)]);
      const task =
        key === undefined
          ? undefined
          : await updateRecord<TaskRecord>(
              store,
              key,
              isTaskRecord,
              (t) => ({ ...t, ...change }),
              taskCondition(id, context),
            );
      if (!task) throw TaskNotFound.make({ id });
      keep(task, context.owner);
      return answerStored(task);
    },
    async deleteTaskDO({ id, name = "default" }, context) {
      const key = taskObjectKey(name, id, context.principal);
      await Promise.all([placement.fence(context.owner), inDirectory(context, name)]);
      const remove = (k: string, revision: number, writeId: string | undefined, entry: number | undefined) =>
        deleteIndexed(index, entry, () => store.delete(k, revision, writeId));
      const deleted =
        key === undefined ? undefined : await deleteRecord(store, key, taskCondition(id, context), remove);
      if (!deleted) throw TaskNotFound.make({ id });
      keep(deleted, context.owner);
      return new StoredAnswer(null, deleted);
    },
    async listTasksDO({ name = "default", ...page }, context) {
      await inDirectory(context, name);
      const collection = nameTasksCollection(taskObjectLeaseKey(name, context.principal)!);
      return listIndexed(index, collection, page, (key) => read(key, context.owner));
    },
  };
}

/** A record the owner holds in memory, and the activation that read or wrote it. */
interface Kept {
  readonly stored: Stored<TaskRecord | null>;
  readonly activation: Activation;
}

// The task-object actor: a stateful object per principal and name (Durable-Object style). Each
// has its own storage (keys `<name-token>.<id>` in the `taskobjects` bucket, a named principal's
// below its owner token: `taskObjectKey`) and at most one live activation across all actor
// processes (placement.ts): a request that reaches a process not holding the object is
// forwarded to the owner's own subject (once), with its principal, and its answer relayed.
import { performance } from "node:perf_hooks";
import { LRUCache } from "lru-cache";
import {
  ApiError,
  BUDGET_HEADER,
  FORWARDED_HEADER,
  GatewayTimeout,
  IDEMPOTENCY_KEY_HEADER,
  KEY_FRESH_HEADER,
  nameToken,
  NotOwner,
  ownedOperations,
  PRINCIPAL_HEADER,
  REQUEST_ID_HEADER,
  ServiceUnavailable,
  SUSPECT_HEADER,
  TakeoverPending,
  TaskNotFound,
  ownerKey,
  taskApi,
  taskObjectKey,
  taskObjectLeaseKey,
  type getTaskDO,
  type Operation,
} from "../schemas/index.ts";
import {
  type CreateOutcome,
  isNoResponders,
  isTimeout,
  parseNatsServerVersion,
  recentEnough,
  recordForward,
  type RecordIndex,
  type RecordStore,
  type Requester,
} from "../platform/index.ts";
import { forwardToOwner } from "./forward.ts";
import { LeaseLost, type Activation, type Placement } from "./placement.ts";
import { createIndexed, deleteIndexed, listIndexed, type IndexedOutcome } from "./pages.ts";
import { listName, nameTasksCollection } from "./task-object-directory.ts";
import { createRecord, deleteRecord, ownPrefix, principalOf, readEntry, updateRecord, type Stored } from "./records.ts";
import {
  answerStored,
  answerStoredAs,
  principalHeader,
  type ApiHandlers,
  type Handler,
  type HandlerContext,
  type OwnerStrategy,
} from "./serve.ts";
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
  /** Carries forwards to the owning process. */
  requester: Requester;
  /** Subject prefix shared with the gateways. */
  prefix: string;
  /** Records kept in memory for reads (default 50,000; 0: none). Records never change. */
  cacheEntries?: number;
  /** Time a request may spend reaching its owner (default 1.2 s, under the gateway's 1.5 s attempt). */
  routeBudgetMs?: number;
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

// One forward attempt: a live owner answers in milliseconds; a paused one never does.
const FORWARD_ATTEMPT_MS = 500;
const WAIT_RECHECK_MS = 200;
// The longest a caller's budget may hold a request here: a takeover (lease TTL + margin) fits.
const MAX_HOLD_MS = 10_000;

const BUDGET_RESERVE_MS = 150;

/** The time a request may spend here: the sender's budget header, else the default. */
function holdBudget(context: HandlerContext, fallbackMs: number): number {
  const sent = Number(context.headers?.get(BUDGET_HEADER));
  if (!(sent > 0)) return fallbackMs;
  return Math.max(1, Math.min(MAX_HOLD_MS, sent - BUDGET_RESERVE_MS));
}

/**
 * getTaskDO answered from storage alone, in any process (the gateway's local reads). True
 * wherever it runs: a record never changes after its create, is stored before that create is
 * answered, and a store of several replicas confirms a miss with the stream leader; so what
 * the owner would answer (it reads the same key) is answered without waiting for the owner.
 */
export function taskObjectReader(store: RecordStore): Handler<typeof getTaskDO> {
  return async ({ id, name }, context) => {
    const key = taskObjectKey(name ?? "default", id, principalOf(context));
    const task = key === undefined ? undefined : await readEntry<TaskRecord>(store, key, isTaskRecord);
    if (!task) throw TaskNotFound.make({ id });
    answerStored(context, task);
    return task.value;
  };
}

/**
 * The owners of names (placement `byName`): the process holding a name's lease runs its
 * requests; any other passes a request on to the owner's own subject (once: a request passed
 * on already is answered NotOwner, no loops) and relays its answer, or waits for a takeover.
 */
export function nameOwners(deps: TaskObjectDeps): OwnerStrategy<Activation> {
  const { placement } = deps;
  const budgetMs = deps.routeBudgetMs ?? 1_200;

  async function forward<T>(
    owner: string,
    op: Operation,
    input: Record<string, unknown>,
    context: HandlerContext,
    timeoutMs: number,
  ): Promise<{ answer: T } | { moved: true }> {
    const headers = {
      [IDEMPOTENCY_KEY_HEADER]: context.idempotencyKey,
      [KEY_FRESH_HEADER]: context.keyFresh ? "1" : undefined,
      [REQUEST_ID_HEADER]: context.headers?.get(REQUEST_ID_HEADER),
      [FORWARDED_HEADER]: "1",
      // Only actors and gateways publish owners' subjects: the owner believes it.
      [PRINCIPAL_HEADER]: principalOf(context),
    };
    try {
      return {
        answer: await forwardToOwner<T>(deps.requester, op, owner, input, {
          timeoutMs,
          prefix: deps.prefix,
          headers,
          onReply: (reply) => answerStoredAs(context, reply),
        }),
      };
    } catch (err) {
      if (err instanceof ApiError && err._tag === NotOwner.tag) return { moved: true as const };
      throw err;
    }
  }

  return {
    ownerId: placement.ownerId,
    ownQueue: `owner.${placement.ownerId}`,
    endpointSuffix: "-owner",
    // Actors and gateways send the caller's principal along to the owner.
    principal: principalHeader,
    /** Runs `work` where the object lives: here if this process holds it, else at its owner. */
    async route(op, input, context, _own, work) {
      // The subject carries the name, and the schema defaults it; the object is the caller's.
      // A name (256 characters at most) and a principal fit in a key.
      const object = taskObjectLeaseKey(ownerKey(op, input), principalOf(context))!;
      const mayForward = !context.headers?.has(FORWARDED_HEADER);
      // A gateway's hedge: the owner it names did not answer it; wait for the takeover here.
      const hedged = context.headers?.get(SUSPECT_HEADER) || undefined;
      const deadline = performance.now() + holdBudget(context, budgetMs);
      let suspect = hedged;
      let outcomeUnknown = false;
      for (;;) {
        const route = await placement.route(object, suspect);
        if (route.kind === "local") {
          try {
            // Records never change once created: reads and creates of a name commute, so they
            // need no mailbox, and concurrent creates share fences (Placement.fence).
            return await placement.run(route.activation, work, { exclusive: false });
          } catch (err) {
            if (!(err instanceof LeaseLost)) throw err;
            // It may have written before its lease was found gone: the next attempt is checked.
            context.keyFresh = false;
          }
        } else if (!mayForward) {
          throw NotOwner.make({});
        } else if (route.kind === "remote") {
          const timeout = Math.max(1, Math.min(FORWARD_ATTEMPT_MS, deadline - performance.now()));
          try {
            const outcome = await forward<Awaited<ReturnType<typeof work>>>(route.owner, op, input, context, timeout);
            if (!("moved" in outcome)) {
              recordForward("answered");
              return outcome.answer;
            }
            recordForward("moved");
            placement.forget(object);
            suspect = undefined;
          } catch (err) {
            if (isNoResponders(err)) recordForward("no_responders");
            else if (isTimeout(err)) recordForward("timeout");
            else throw err;
            outcomeUnknown ||= isTimeout(err);
            // The owner may have run it: the next attempt is checked.
            if (isTimeout(err)) context.keyFresh = false;
            suspect = route.owner;
          }
        } else if (hedged && route.until > deadline) {
          // The takeover comes after the sender stops waiting: tell it who will hold the name.
          throw TakeoverPending.make({ process: placement.ownerId });
        } else {
          // Read the lease again now and then: a release lets the name be claimed at once.
          const pause = Math.min(route.until, deadline, performance.now() + WAIT_RECHECK_MS) - performance.now();
          if (pause > 0) await new Promise((r) => setTimeout(r, pause));
        }
        // A forward that timed out may still have run at the owner: its outcome is unknown.
        if (performance.now() >= deadline) throw outcomeUnknown ? GatewayTimeout.make({}) : ServiceUnavailable.make({});
      }
    },
  };
}

/**
 * The owner's side of the task-object operations: reads from this activation's memory or
 * storage, writes fenced by the name's activation. The adapter (`serveApi` with `nameOwners`)
 * runs them only where the name lives.
 */
export function taskObjectHandlers(
  deps: Pick<TaskObjectDeps, "store" | "index" | "placement" | "cacheEntries" | "fenceInCreate">,
): TaskObjectHandlers {
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
  const inDirectory = async (context: { readonly owner: Activation; readonly principal?: string }, name: string) => {
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
      const key = taskObjectKey(name, id, principalOf(context));
      const task = key === undefined ? undefined : await read(key, context.owner);
      if (!task) throw TaskNotFound.make({ id });
      answerStored(context, task);
      return task.value;
    },
    async createTaskDO({ title, name = "default" }, context) {
      // The adapter fixed the id before any forward, so a repeated forward creates one record.
      const task: TaskRecord = { id: context.idempotencyKey!, title, completed: false };
      const key = taskObjectKey(name, task.id, principalOf(context))!;
      await inDirectory(context, name);
      const stored = await createRecord(
        store,
        key,
        task,
        isTaskRecord,
        (s) => s.title === task.title,
        (k, data): Promise<IndexedOutcome> =>
          fencedCreate(
            context.owner,
            taskObjectLeaseKey(name, principalOf(context))!,
            k,
            data,
            context.keyFresh === true,
          ),
      );
      // Not kept: most created records are never read at the owner (the gateways read storage),
      // and keeping each one carried it into the old generation. Nothing kept goes stale: a
      // create succeeds only for a key with no write before it, and answers a repeat as stored.
      answerStored(context, stored);
      return stored.value;
    },
    async updateTaskDO({ id, name = "default", ...change }, context) {
      const key = taskObjectKey(name, id, principalOf(context));
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
      answerStored(context, task);
      return task.value;
    },
    async deleteTaskDO({ id, name = "default" }, context) {
      const key = taskObjectKey(name, id, principalOf(context));
      await Promise.all([placement.fence(context.owner), inDirectory(context, name)]);
      const remove = (k: string, revision: number, writeId: string | undefined, entry: number | undefined) =>
        deleteIndexed(index, entry, () => store.delete(k, revision, writeId));
      const deleted =
        key === undefined ? undefined : await deleteRecord(store, key, taskCondition(id, context), remove);
      if (!deleted) throw TaskNotFound.make({ id });
      keep(deleted, context.owner);
      answerStored(context, deleted);
      return null;
    },
    async listTasksDO({ name = "default", ...page }, context) {
      await inDirectory(context, name);
      const collection = nameTasksCollection(taskObjectLeaseKey(name, principalOf(context))!);
      return listIndexed(index, collection, page, (key) => read(key, context.owner));
    },
  };
}

/** A record the owner holds in memory, and the activation that read or wrote it. */
interface Kept {
  readonly stored: Stored<TaskRecord | null>;
  readonly activation: Activation;
}

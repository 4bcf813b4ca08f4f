// The task actor: tasks in the object store (the `tasks` KV bucket), keyed by id.
import type { RecordStore } from "../platform/index.ts";
import { v4 as uuidv4 } from "uuid";
import {
  PreconditionFailed,
  Task,
  TaskNotFound,
  type createTask,
  type deleteTask,
  decodeFailure,
  type getTask,
  type listTasks,
  type updateTask,
} from "../schemas/index.ts";
import type { Static } from "@sinclair/typebox";
import {
  createRecord,
  deleteRecord,
  keyOfCursor,
  listRecords,
  matchesSchema,
  ownKey,
  ownPrefix,
  readEntry,
  updateRecord,
  type WriteCondition,
} from "./records.ts";
import { answerStored, type Handler, type HandlerContext } from "./serve.ts";

export type TaskRecord = Static<typeof Task>;

/** A stored task (in the task and the task-object buckets) has the contract's Task shape. */
export const isTaskRecord = matchesSchema(Task);

export interface TaskHandlers {
  getTask: Handler<typeof getTask>;
  createTask: Handler<typeof createTask>;
  updateTask: Handler<typeof updateTask>;
  deleteTask: Handler<typeof deleteTask>;
  listTasks: Handler<typeof listTasks>;
}

/** A list's page request from its input: `limit` (default 100) and the key after which it starts (400 for a cursor not given by it). */
export function pageOf(input: { limit?: number | string; cursor?: string }, prefix: string) {
  const after = input.cursor === undefined ? undefined : keyOfCursor(input.cursor, prefix);
  if (input.cursor !== undefined && after === undefined)
    throw decodeFailure(["cursor"], "not a cursor this list answered");
  return { limit: Number(input.limit ?? 100), after };
}

/** A write's condition from its context: `If-Match` of task `id`, refused as 412 PreconditionFailed. */
export function taskCondition(id: string, context: HandlerContext): WriteCondition {
  return {
    ifMatch: context.ifMatch,
    mismatch: (revision) => PreconditionFailed.make({ id, revision }),
    writeId: context.idempotencyKey,
  };
}

export function taskHandlers(store: RecordStore): TaskHandlers {
  return {
    async getTask({ id }, context) {
      const key = ownKey(context, id);
      const task = key === undefined ? undefined : await readEntry<TaskRecord>(store, key, isTaskRecord);
      if (!task) throw TaskNotFound.make({ id });
      answerStored(context, task);
      return task.value;
    },
    async createTask({ title }, context) {
      const task: TaskRecord = { id: context.idempotencyKey ?? uuidv4(), title, completed: false };
      const key = ownKey(context, task.id)!;
      const stored = await createRecord(store, key, task, isTaskRecord, (s) => s.title === title);
      answerStored(context, stored);
      return stored.value;
    },
    async updateTask({ id, ...change }, context) {
      const key = ownKey(context, id);
      const condition = taskCondition(id, context);
      const task =
        key === undefined
          ? undefined
          : await updateRecord<TaskRecord>(store, key, isTaskRecord, (t) => ({ ...t, ...change }), condition);
      if (!task) throw TaskNotFound.make({ id });
      answerStored(context, task);
      return task.value;
    },
    async deleteTask({ id }, context) {
      const key = ownKey(context, id);
      const deleted = key === undefined ? undefined : await deleteRecord(store, key, taskCondition(id, context));
      if (!deleted) throw TaskNotFound.make({ id });
      answerStored(context, deleted);
      return null;
    },
    async listTasks(input, context) {
      const prefix = ownPrefix(context);
      return listRecords(store, prefix, pageOf(input, prefix), (key) =>
        readEntry<TaskRecord>(store, key, isTaskRecord),
      );
    },
  };
}

// The task actor: tasks in the object store (the `tasks` KV bucket), keyed by id.
import { bucketNames, collectionSubject, type RecordIndex, type RecordStore } from "../platform/index.ts";
import { v4 as uuidv4 } from "uuid";
import {
  idKey,
  PreconditionFailed,
  Task,
  TaskNotFound,
  type createTask,
  type deleteTask,
  type getTask,
  type listTasks,
  type updateTask,
} from "../schemas/index.ts";
import type { Static } from "@sinclair/typebox";
import { createIndexed, deleteIndexed, listIndexed } from "./pages.ts";
import { createRecord, deleteRecord, matchesSchema, readEntry, updateRecord, type WriteCondition } from "./records.ts";
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

/** A write's condition from its context: `If-Match` of task `id`, refused as 412 PreconditionFailed. */
export function taskCondition(id: string, context: HandlerContext): WriteCondition {
  return {
    ifMatch: context.ifMatch,
    mismatch: (revision) => PreconditionFailed.make({ id, revision }),
    writeId: context.idempotencyKey,
  };
}

/** The key prefix of the tasks' records, and the collection of their index entries (their list). */
const TASKS_PREFIX = "";
export const tasksCollection = collectionSubject(bucketNames.tasks, TASKS_PREFIX);

/** The task actor's handlers over the `tasks` bucket; `index` holds its list (creation order). */
export function taskHandlers(store: RecordStore, index: RecordIndex): TaskHandlers {
  return {
    async getTask({ id }, context) {
      const key = idKey(id);
      const task = key === undefined ? undefined : await readEntry<TaskRecord>(store, key, isTaskRecord);
      if (!task) throw TaskNotFound.make({ id });
      answerStored(context, task);
      return task.value;
    },
    async createTask({ title }, context) {
      const task: TaskRecord = { id: context.idempotencyKey ?? uuidv4(), title, completed: false };
      const stored = await createRecord(
        store,
        task.id,
        task,
        isTaskRecord,
        (s) => s.title === title,
        (key, data) => createIndexed(index, tasksCollection, key, (entry) => store.create(key, data, entry)),
      );
      answerStored(context, stored);
      return stored.value;
    },
    async updateTask({ id, ...change }, context) {
      const key = idKey(id);
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
      const key = idKey(id);
      const remove = (k: string, revision: number, writeId: string | undefined, entry: number | undefined) =>
        deleteIndexed(index, entry, () => store.delete(k, revision, writeId));
      const deleted =
        key === undefined ? undefined : await deleteRecord(store, key, taskCondition(id, context), remove);
      if (!deleted) throw TaskNotFound.make({ id });
      answerStored(context, deleted);
      return null;
    },
    async listTasks(input) {
      return listIndexed(index, tasksCollection, input, (key) => readEntry<TaskRecord>(store, key, isTaskRecord));
    },
  };
}

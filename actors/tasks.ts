// The task actor: tasks in the object store (the `tasks` KV bucket), keyed by id.
import { bucketNames, collectionSubject, type RecordIndex, type RecordStore } from "../platform/index.ts";
import { v4 as uuidv4 } from "uuid";
import {
  answerStored,
  PreconditionFailed,
  StoredAnswer,
  Task,
  TaskNotFound,
  type taskRecordApi,
} from "../schemas/index.ts";
import type { Static } from "@sinclair/typebox";
import { createIndexed, deleteIndexed, listIndexed } from "./pages.ts";
import {
  createRecord,
  deleteRecord,
  matchesSchema,
  ownKey,
  ownPrefix,
  readEntry,
  updateRecord,
  type WriteCondition,
} from "./records.ts";
import type { HandlerContext } from "../placement/index.ts";
import type { ApiHandlers } from "./serve.ts";

export type TaskRecord = Static<typeof Task>;

/** A stored task (in the task and the task-object buckets) has the contract's Task shape. */
export const isTaskRecord = matchesSchema(Task);

/** A write's condition from its context: `If-Match` of task `id`, refused as 412 PreconditionFailed. */
export function taskCondition(id: string, context: HandlerContext): WriteCondition {
  return {
    ifMatch: context.ifMatch,
    mismatch: (revision) => PreconditionFailed.make({ id, revision }),
    writeId: context.idempotencyKey,
  };
}

/** The collection of the index entries of one principal's tasks (their list), by its key prefix (`ownerPrefix`). */
export const tasksCollection = (prefix: string): string => collectionSubject(bucketNames.tasks, prefix);

/** The task actor's handlers over the `tasks` bucket; `index` holds its list (creation order). */
export function taskHandlers(store: RecordStore, index: RecordIndex): ApiHandlers<typeof taskRecordApi> {
  return {
    async getTask({ id }, context) {
      const key = ownKey(context, id);
      const task = key === undefined ? undefined : await readEntry<TaskRecord>(store, key, isTaskRecord);
      if (!task) throw TaskNotFound.make({ id });
      return answerStored(task);
    },
    async createTask({ title }, context) {
      const task: TaskRecord = { id: context.idempotencyKey ?? uuidv4(), title, completed: false };
      const key = ownKey(context, task.id)!;
      const collection = tasksCollection(ownPrefix(context));
      const stored = await createRecord(
        store,
        key,
        task,
        isTaskRecord,
        (s) => s.title === title,
        (k, data) => createIndexed(index, collection, k, (entry) => store.create(k, data, entry)),
      );
      return answerStored(stored);
    },
    async updateTask({ id, ...change }, context) {
      const key = ownKey(context, id);
      const condition = taskCondition(id, context);
      const task =
        key === undefined
          ? undefined
          : await updateRecord<TaskRecord>(store, key, isTaskRecord, (t) => ({ ...t, ...change }), condition);
      if (!task) throw TaskNotFound.make({ id });
      return answerStored(task);
    },
    async deleteTask({ id }, context) {
      const key = ownKey(context, id);
      const remove = (k: string, revision: number, writeId: string | undefined, entry: number | undefined) =>
        deleteIndexed(index, entry, () => store.delete(k, revision, writeId));
      const deleted =
        key === undefined ? undefined : await deleteRecord(store, key, taskCondition(id, context), remove);
      if (!deleted) throw TaskNotFound.make({ id });
      return new StoredAnswer(null, deleted);
    },
    async listTasks(input, context) {
      const collection = tasksCollection(ownPrefix(context));
      return listIndexed(index, collection, input, (key) => readEntry<TaskRecord>(store, key, isTaskRecord));
    },
  };
}

// The task actor: tasks in the object store (the `tasks` KV bucket), keyed by id.
import type { RecordStore } from "../platform/index.ts";
import { v4 as uuidv4 } from "uuid";
import { idKey, Task, TaskNotFound, type createTask, type deleteTask, type getTask } from "../schemas/index.ts";
import type { Static } from "@sinclair/typebox";
import { createRecord, deleteRecord, matchesSchema, readRecord } from "./records.ts";
import type { Handler } from "./serve.ts";

export type TaskRecord = Static<typeof Task>;

/** A stored task (in the task and the task-object buckets) has the contract's Task shape. */
export const isTaskRecord = matchesSchema(Task);

export interface TaskHandlers {
  getTask: Handler<typeof getTask>;
  createTask: Handler<typeof createTask>;
  deleteTask: Handler<typeof deleteTask>;
}

export function taskHandlers(store: RecordStore): TaskHandlers {
  return {
    async getTask({ id }) {
      const key = idKey(id);
      const task = key === undefined ? undefined : await readRecord<TaskRecord>(store, key, isTaskRecord);
      if (!task) throw TaskNotFound.make({ id });
      return task;
    },
    async createTask({ title }, { idempotencyKey }) {
      const task: TaskRecord = { id: idempotencyKey ?? uuidv4(), title, completed: false };
      return createRecord(store, task.id, task, isTaskRecord, (stored) => stored.title === title);
    },
    async deleteTask({ id }) {
      const key = idKey(id);
      if (key === undefined || !(await deleteRecord(store, key))) throw TaskNotFound.make({ id });
      return null;
    },
  };
}

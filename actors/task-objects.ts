// The task-object actor: a stateful object per name (Durable-Object style). Each name has
// its own storage (keys `<name-token>.<id>` in the `taskobjects` bucket) and a mailbox, so
// a name's requests run one at a time in this process.
import type { RecordStore } from "../platform/index.ts";
import { v4 as uuidv4 } from "uuid";
import {
  TaskNotFound,
  taskObjectKey,
  type createTaskDO,
  type getTaskDO,
} from "../schemas/index.ts";
import { Mailboxes } from "./mailbox.ts";
import { createRecord, readRecord } from "./records.ts";
import type { Handler } from "./serve.ts";
import type { TaskRecord } from "./tasks.ts";

export interface TaskObjectHandlers {
  getTaskDO: Handler<typeof getTaskDO>;
  createTaskDO: Handler<typeof createTaskDO>;
}

export function taskObjectHandlers(store: RecordStore, mailboxes = new Mailboxes()): TaskObjectHandlers {
  // `name` is always present: the subject carries it and the schema defaults it.
  return {
    getTaskDO: ({ id, name = "default" }) =>
      mailboxes.run(name, async () => {
        const key = taskObjectKey(name, id);
        const task = key === undefined ? undefined : await readRecord<TaskRecord>(store, key);
        if (!task) throw TaskNotFound.make({ id });
        return task;
      }),
    createTaskDO: ({ title, name = "default" }, { idempotencyKey }) =>
      mailboxes.run(name, () => {
        const task: TaskRecord = { id: idempotencyKey ?? uuidv4(), title, completed: false };
        return createRecord(store, taskObjectKey(name, task.id)!, task, (s) => s.title === title);
      }),
  };
}

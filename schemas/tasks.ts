// Task API contracts: the object-store operations and the task-object (`/do`) operations.
import { Type } from "@sinclair/typebox";
import { Count } from "./counts.ts";
import { PreconditionFailed, TaskNotFound, TaskObjectBusy, TaskObjectNotFound } from "./errors.ts";
import { ownedByName, stateless } from "./placement.ts";
import { NoContent } from "./replies.ts";
import type { Operation } from "./types.ts";

/** A task as stored and answered. */
export const Task = Type.Object({
  id: Type.String({ description: "uuid v4 assigned at creation" }),
  title: Type.String(),
  completed: Type.Boolean(),
});

const TaskIdParams = Type.Object({ id: Type.String() }, { additionalProperties: false });
const CreateTaskPayload = Type.Object({ title: Type.String() }, { additionalProperties: false });
/** The fields to change: at least one. */
const UpdateTaskPayload = Type.Object(
  { title: Type.Optional(Type.String()), completed: Type.Optional(Type.Boolean()) },
  { additionalProperties: false, minProperties: 1 },
);
/** A task object's name: any non-empty string up to 256 characters. */
const TaskObjectName = { minLength: 1, maxLength: 256 } as const;
/** `?name=` selects the task object (default `default`). */
const TaskObjectQuery = Type.Object(
  { name: Type.Optional(Type.String({ ...TaskObjectName, default: "default" })) },
  { additionalProperties: false },
);
/** `/do/objects/:name`: the task object described. */
const TaskObjectParams = Type.Object({ name: Type.String(TaskObjectName) }, { additionalProperties: false });

/**
 * `?limit=` (1-1000, default 100; a number over NATS) and `?cursor=` (from the page before) of
 * a list of tasks or of task objects.
 */
const PageFields = {
  limit: Type.Optional(Count(1000, "items per page, 1-1000 (default 100)")),
  cursor: Type.Optional(
    Type.String({ pattern: "^[A-Za-z0-9_-]{1,1400}$", description: "the `cursor` of the page before" }),
  ),
};
const PageQuery = Type.Object(PageFields, { additionalProperties: false });
const TaskObjectPageQuery = Type.Object(
  { ...TaskObjectQuery.properties, ...PageFields },
  { additionalProperties: false },
);

/** A page of tasks in a stable order (by key); `cursor` asks for the next, absent on the last page. */
export const TaskPage = Type.Object({
  items: Type.Array(Task),
  cursor: Type.Optional(Type.String()),
});

/** What a task object holds now, and where it is active. */
export const TaskObjectInfo = Type.Object({
  name: Type.String(),
  tasks: Type.Integer({ minimum: 0, description: "tasks the object stores now" }),
  activeOn: Type.Optional(
    Type.String({
      description: "the actor process (host-pid-suffix) holding its activation; absent when none holds it",
    }),
  ),
  leaseAgeMs: Type.Optional(
    Type.Integer({ minimum: 0, description: "how long that activation has held the name (ms); absent when none" }),
  ),
});

/** A page of task objects in a stable order (by name token); `cursor` asks for the next, absent on the last page. */
export const TaskObjectPage = Type.Object({
  items: Type.Array(TaskObjectInfo),
  cursor: Type.Optional(Type.String()),
});

export const getTask = {
  name: "getTask",
  api: "task",
  http: { method: "GET", path: "/:id" },
  subject: "tasks.get",
  placement: stateless,
  /** Changed only by updateTask and deleteTask, whose writes the bucket publishes. */
  reads: "versioned",
  params: TaskIdParams,
  success: Task,
  errors: [TaskNotFound],
  summary: "Read a task from the object store",
} as const satisfies Operation;

export const createTask = {
  name: "createTask",
  api: "task",
  http: { method: "POST", path: "/" },
  subject: "tasks.create",
  placement: stateless,
  payload: CreateTaskPayload,
  success: Task,
  errors: [],
  idempotent: true,
  summary: "Create a task in the object store",
} as const satisfies Operation;

export const getTaskDO = {
  name: "getTaskDO",
  api: "task",
  http: { method: "GET", path: "/do/:id" },
  subject: "taskobjects.{name}.get",
  placement: ownedByName("name"),
  /**
   * Changed only by the name's activation, whose writes the bucket publishes; a create is answered after it is stored.
   */
  reads: "versioned",
  params: TaskIdParams,
  query: TaskObjectQuery,
  success: Task,
  errors: [TaskNotFound, TaskObjectBusy],
  summary: "Read a task from the task object named by ?name= (default `default`)",
} as const satisfies Operation;

export const createTaskDO = {
  name: "createTaskDO",
  api: "task",
  http: { method: "POST", path: "/do" },
  subject: "taskobjects.{name}.create",
  placement: ownedByName("name"),
  query: TaskObjectQuery,
  payload: CreateTaskPayload,
  success: Task,
  errors: [TaskObjectBusy],
  idempotent: true,
  summary: "Create a task in the task object named by ?name= (default `default`)",
} as const satisfies Operation;

export const deleteTask = {
  name: "deleteTask",
  api: "task",
  http: { method: "DELETE", path: "/:id" },
  subject: "tasks.delete",
  placement: stateless,
  params: TaskIdParams,
  success: NoContent,
  errors: [TaskNotFound, PreconditionFailed],
  idempotent: true,
  summary: "Delete a task from the object store (`If-Match`: only at that revision)",
} as const satisfies Operation;

export const updateTask = {
  name: "updateTask",
  api: "task",
  http: { method: "PATCH", path: "/:id" },
  subject: "tasks.update",
  placement: stateless,
  params: TaskIdParams,
  payload: UpdateTaskPayload,
  success: Task,
  errors: [TaskNotFound, PreconditionFailed],
  idempotent: true,
  summary: "Change a task's title and/or completed (`If-Match`: only at that revision)",
} as const satisfies Operation;

export const listTasks = {
  name: "listTasks",
  api: "task",
  http: { method: "GET", path: "/" },
  subject: "tasks.list",
  placement: stateless,
  query: PageQuery,
  success: TaskPage,
  errors: [],
  summary: "A page of the object store's tasks (by key); `cursor` asks for the next page",
} as const satisfies Operation;

export const updateTaskDO = {
  name: "updateTaskDO",
  api: "task",
  http: { method: "PATCH", path: "/do/:id" },
  subject: "taskobjects.{name}.update",
  placement: ownedByName("name"),
  params: TaskIdParams,
  query: TaskObjectQuery,
  payload: UpdateTaskPayload,
  success: Task,
  errors: [TaskNotFound, PreconditionFailed, TaskObjectBusy],
  idempotent: true,
  summary: "Change a task of the task object named by ?name= (`If-Match`: only at that revision)",
} as const satisfies Operation;

export const deleteTaskDO = {
  name: "deleteTaskDO",
  api: "task",
  http: { method: "DELETE", path: "/do/:id" },
  subject: "taskobjects.{name}.delete",
  placement: ownedByName("name"),
  params: TaskIdParams,
  query: TaskObjectQuery,
  success: NoContent,
  errors: [TaskNotFound, PreconditionFailed, TaskObjectBusy],
  idempotent: true,
  summary: "Delete a task of the task object named by ?name= (`If-Match`: only at that revision)",
} as const satisfies Operation;

export const listTasksDO = {
  name: "listTasksDO",
  api: "task",
  http: { method: "GET", path: "/do/tasks" },
  subject: "taskobjects.{name}.list",
  placement: ownedByName("name"),
  query: TaskObjectPageQuery,
  success: TaskPage,
  errors: [TaskObjectBusy],
  summary: "A page of the tasks of the task object named by ?name= (by key), from its owner",
} as const satisfies Operation;

export const listTaskObjects = {
  name: "listTaskObjects",
  api: "task",
  http: { method: "GET", path: "/do/objects" },
  subject: "taskobjects.list",
  // Any actor answers from storage: listing objects must not activate them.
  placement: stateless,
  query: PageQuery,
  success: TaskObjectPage,
  errors: [],
  summary: "A page of the task objects that store tasks or are active (by name token); `cursor` asks for the next",
} as const satisfies Operation;

export const getTaskObject = {
  name: "getTaskObject",
  api: "task",
  http: { method: "GET", path: "/do/objects/:name" },
  subject: "taskobjects.{name}.info",
  // Any actor answers from storage: describing an object must not activate it.
  placement: stateless,
  params: TaskObjectParams,
  success: TaskObjectInfo,
  errors: [TaskObjectNotFound],
  summary: "How many tasks a task object stores, and which process holds its activation",
} as const satisfies Operation;

/**
 * The Task API, in route order: `/do` routes before `/:id`, and the static `/do/tasks` and
 * `/do/objects` before `/do/:id` (a task id is never `tasks` or `objects`: ids are uuids).
 */
export const taskApi = {
  createTask,
  listTasksDO,
  listTaskObjects,
  getTaskObject,
  getTaskDO,
  updateTaskDO,
  deleteTaskDO,
  createTaskDO,
  listTasks,
  getTask,
  updateTask,
  deleteTask,
} as const;

/** The task records' operations: the Task API's stateless operations on the `tasks` bucket. */
export const taskRecordApi = { createTask, listTasks, getTask, updateTask, deleteTask } as const;

/** The directory of task objects: any actor answers from storage, without activating a name. */
export const taskObjectDirectoryApi = { listTaskObjects, getTaskObject } as const;

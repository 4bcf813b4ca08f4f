// Task API contracts: the object-store operations and the task-object (`/do`) operations.
import { Type } from "@sinclair/typebox";
import { PreconditionFailed, TaskNotFound } from "./errors.ts";
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
/** `?name=` selects the task object; any non-empty string up to 256 characters. */
const TaskObjectQuery = Type.Object(
  { name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, default: "default" })) },
  { additionalProperties: false },
);

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
  /** Changed only by the name's activation, whose writes the bucket publishes; a create is answered after it is stored. */
  reads: "versioned",
  params: TaskIdParams,
  query: TaskObjectQuery,
  success: Task,
  errors: [TaskNotFound],
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
  errors: [],
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
  summary: "Change a task's title and/or completed (`If-Match`: only at that revision)",
} as const satisfies Operation;

/** The Task API, in route order: `/do` routes before `/:id`. */
export const taskApi = { createTask, getTaskDO, createTaskDO, getTask, updateTask, deleteTask } as const;

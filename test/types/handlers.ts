// Type-level checks, run by `npx tsc --noEmit -p .` (nothing here runs; not a `*.test.ts`):
// every `@ts-expect-error` line must fail to compile, else the typecheck fails. They hold the
// claims that a handler map missing an operation, or a storage read of an operation that does
// not declare `reads`, does not compile.
import type { NatsConnection } from "@nats-io/transport-node";
import { type actorApi, serveApi, type Activation, type ApiHandlers, type OwnerStrategy } from "../../actors/index.ts";
import { jobApi, taskApi, type ReadOperations, type StorageReads } from "../../schemas/index.ts";

declare const nc: NatsConnection;
declare const jobs: ApiHandlers<typeof jobApi>;
declare const tasks: ApiHandlers<typeof taskApi>;
const options = { prefix: "", queue: () => "q" };

export const complete = () => serveApi(nc, jobApi, { getJob: jobs.getJob, createJob: jobs.createJob }, options);

// @ts-expect-error createJob has no handler
export const missing = () => serveApi(nc, jobApi, { getJob: jobs.getJob }, options);

// @ts-expect-error createJob's slot holds getJob's handler (another input and answer)
export const swapped = () => serveApi(nc, jobApi, { getJob: jobs.getJob, createJob: jobs.getJob }, options);

// @ts-expect-error a map for the task API lacks the task-object operations
export const partial: ApiHandlers<typeof taskApi> = { getTask: tasks.getTask, createTask: tasks.createTask };

// Storage reads: only operations whose contract declares `reads`.
export const reads: StorageReads<typeof taskApi> = { getTask: tasks.getTask, getTaskDO: tasks.getTaskDO };

// @ts-expect-error createTask declares no `reads`: no process answers it from storage
export const notARead: StorageReads<typeof taskApi> = { createTask: tasks.createTask };

// @ts-expect-error every read of the actors' operations needs its storage read (getJob, getTaskDO missing)
export const someReads: ApiHandlers<ReadOperations<typeof actorApi>> = { getTask: tasks.getTask };

// Placement belongs to the adapter: an API with owned operations is served with their owner strategy.
declare const objects: ApiHandlers<typeof taskApi, { readonly byName: Activation }>;
declare const byName: OwnerStrategy<Activation>;
export const placed = () => serveApi(nc, taskApi, objects, { ...options, owners: { byName } });

// @ts-expect-error the task API has operations placed by name: serving it needs their owner strategy
export const unplaced = () => serveApi(nc, taskApi, objects, options);

// @ts-expect-error an owned operation's handler gets what its owner holds: a handler map without it does not serve
export const ownerless = () => serveApi(nc, taskApi, tasks, { ...options, owners: { byName } });

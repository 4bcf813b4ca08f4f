// The Task API's updates, deletes and lists, on tasks and task objects, and the task-object
// directory. Deletes each remove a task seeded for them (see `pooled`), so each is a 204;
// opt-in rows run only when `--only` names them (see --help).
import { cycle, http, pooled, type Runner } from "./runners.ts";
import { seedDoTasks, seedTasks } from "./seed.ts";
import type { HttpRequestSpec } from "./types.ts";
import type { Workload } from "./workload.ts";

/** A page as the rows ask for it. */
const PAGE = 100;
/** Task objects the deleteTaskDO pool spreads over, apart from the ones the other rows read. */
const deletedObjectNames = Array.from({ length: 20 }, (_, k) => `bench-del-${k}`);
/** Creates in flight while a delete pool is topped up. */
const POOL_SEED_CONCURRENCY = 64;
/**
 * Task objects that listTasksDO and getTaskObject read, each seeded with more than a page and
 * written by no other row, so what a read costs does not depend on the rows before it.
 */
const listedObjectNames = Array.from({ length: 10 }, (_, k) => `bench-list-${k}`);
const TASKS_PER_LISTED_OBJECT = 120;

/** Per service: its listed objects' names, once their tasks are created (by the first row that asks). */
const listedObjects = new Map<string, Promise<string[]>>();
function listedObjectsOf(taskUrl: string): Promise<string[]> {
  let names = listedObjects.get(taskUrl);
  if (!names) {
    const count = listedObjectNames.length * TASKS_PER_LISTED_OBJECT;
    names = seedDoTasks(taskUrl, listedObjectNames, count).then(() => listedObjectNames);
    listedObjects.set(taskUrl, names);
  }
  return names;
}

/** PATCH bodies in turn, one per pass over the records: every update changes the record. */
function updateBodies(count: number): (i: number) => string {
  const bodies = [JSON.stringify({ completed: true }), JSON.stringify({ title: "bench updated" })];
  return (i) => bodies[Math.floor(i / count) % 2]!;
}

/** PATCH `path(record)` over `records`, alternating the update bodies. */
function updates<T>(url: string, records: T[], path: (record: T) => string): Runner {
  const next = cycle(records);
  const body = updateBodies(records.length);
  let i = 0;
  return http(url, () => ({ method: "PATCH", path: path(next()), body: body(i++) }));
}

const deletePool = (seed: (count: number) => Promise<string[]>) => async (count: number) =>
  (await seed(count)).map((path): HttpRequestSpec => ({ method: "DELETE", path }));

export const crudWorkloads: Workload[] = [
  {
    name: "updateTask",
    summary: "PATCH /<id> over the seeded tasks, {completed:true} and {title} in turn",
    serviceGroup: "service",
    prepare: async (ctx) => updates(ctx.taskUrl, await ctx.seeds.taskIds(), (id) => `/${id}`),
  },
  {
    name: "updateTaskDO",
    summary: "PATCH /do/<id>?name=bench-<k> over the seeded task-object tasks, as updateTask",
    serviceGroup: "service",
    prepare: async (ctx) => updates(ctx.taskUrl, await ctx.seeds.doTasks(), ({ name, id }) => `/do/${id}?name=${name}`),
  },
  {
    name: "listTasksDO",
    summary:
      `GET /do/tasks?name=bench-list-<k>&limit=${PAGE}: a full first page of 10 objects of ` +
      `${TASKS_PER_LISTED_OBJECT} tasks each, in turn`,
    serviceGroup: "service",
    async prepare(ctx) {
      const name = cycle(await listedObjectsOf(ctx.taskUrl));
      return http(ctx.taskUrl, () => ({ method: "GET", path: `/do/tasks?name=${name()}&limit=${PAGE}` }));
    },
  },
  {
    name: "getTaskObject",
    summary: `GET /do/objects/bench-list-<k> over the 10 objects of ${TASKS_PER_LISTED_OBJECT} tasks listTasksDO reads`,
    serviceGroup: "service",
    async prepare(ctx) {
      const name = cycle(await listedObjectsOf(ctx.taskUrl));
      return http(ctx.taskUrl, () => ({ method: "GET", path: `/do/objects/${name()}` }));
    },
  },
  {
    name: "deleteTask",
    summary: "DELETE /<id>, each of a task created for it before the load (unmeasured): every answer a 204",
    serviceGroup: "service",
    optIn: true,
    prepare: async (ctx) =>
      pooled(
        ctx.taskUrl,
        deletePool(async (count) => (await seedTasks(ctx.taskUrl, count, POOL_SEED_CONCURRENCY)).map((id) => `/${id}`)),
      ),
  },
  {
    name: "deleteTaskDO",
    summary:
      "DELETE /do/<id>?name=bench-del-<k>, each of a task created for it before the load (unmeasured): every " +
      "answer a 204",
    serviceGroup: "service",
    optIn: true,
    prepare: async (ctx) =>
      pooled(
        ctx.taskUrl,
        deletePool(async (count) =>
          (await seedDoTasks(ctx.taskUrl, deletedObjectNames, count, POOL_SEED_CONCURRENCY)).map(
            ({ name, id }) => `/do/${id}?name=${name}`,
          ),
        ),
      ),
  },
];

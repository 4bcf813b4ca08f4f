// The list rows: each list's page at 1,000 and at 100,000 records, each size on a stack of its
// own seeded straight into KV and the index (list-seed.ts). A request asks for a full page of
// 100 at a random place in the collection (a cursor made as the service makes them), so the
// rows measure every page of a walk, not only the first. One request at a time: a page's
// latency as a client walking a list sees it, not a queue behind 50 connections.
import { cursorAt } from "../actors/pages.ts";
import { namesCollection, nameTasksCollection } from "../actors/task-object-directory.ts";
import { tasksCollection } from "../actors/tasks.ts";
import { nameToken } from "../schemas/index.ts";
import { listScales, type ListScale, type ListStack } from "./environment.ts";
import { LISTED_NAMES, seedLists, type ListSeeds } from "./list-seed.ts";
import { cycle, http, type Runner } from "./runners.ts";
import type { Workload, WorkloadContext } from "./workload.ts";

/** A page as the rows ask for it. */
const PAGE = 100;
/** Requests in flight per list row. */
export const LIST_CONNECTIONS = 1;

/** Whether `workload` is one of the list rows (named `<list>:1k` or `<list>:100k`). */
export const isListRow = (workload: string): boolean =>
  /^(listTasks|listTasksDO|listTaskObjects|getTaskObject):/.test(workload);

const seeded = new Map<ListStack, Promise<ListSeeds>>();
function seedsOf(ctx: WorkloadContext, scale: ListScale): { stack: ListStack; seeds: Promise<ListSeeds> } {
  const stack = ctx.lists?.[scale];
  if (!stack) throw new Error("the list rows need their stacks (started when one of them runs)");
  let seeds = seeded.get(stack);
  if (!seeds) {
    seeds = seedLists(stack.taskUrl, stack.requester, listScales[scale]);
    seeded.set(stack, seeds);
  }
  return { stack, seeds };
}

/** The query of a full page at a random place among `entries` of the collection `subject`. */
function randomPage(subject: string, entries: number[]): () => string {
  const starts = Math.max(1, entries.length - PAGE + 1);
  return () => {
    const at = Math.floor(Math.random() * starts);
    return at === 0 ? `limit=${PAGE}` : `limit=${PAGE}&cursor=${cursorAt(subject, entries[at - 1]!)}`;
  };
}

function listRows(scale: ListScale): Workload[] {
  const records = listScales[scale].toLocaleString("en-US");
  const serviceGroup = scale === "1k" ? "lists1k" : "lists100k";
  const row = (name: string, summary: string, path: (seeds: ListSeeds) => () => string): Workload => ({
    name: `${name}:${scale}`,
    summary: `${summary}; one request at a time`,
    serviceGroup,
    async prepare(ctx): Promise<Runner> {
      const { stack, seeds } = seedsOf(ctx, scale);
      const next = path(await seeds);
      const run = http(stack.taskUrl, () => ({ method: "GET", path: next() }));
      return (settings) => run({ ...settings, connections: LIST_CONNECTIONS });
    },
  });
  const big = nameToken("big");
  return [
    row("listTasks", `GET /?limit=${PAGE}&cursor=<random place> over ${records} tasks`, (seeds) => {
      const query = randomPage(tasksCollection(""), seeds.tasks);
      return () => `/?${query()}`;
    }),
    row(
      "listTasksDO",
      `GET /do/tasks?name=big&limit=${PAGE}&cursor=<random place>: big holds half of ${records} task-object tasks`,
      (seeds) => {
        const query = randomPage(nameTasksCollection(big), seeds.big);
        return () => `/do/tasks?name=big&${query()}`;
      },
    ),
    row(
      "listTaskObjects",
      `GET /do/objects?limit=${PAGE}&cursor=<random place>: 400 names holding ${records} tasks, each counted`,
      (seeds) => {
        const query = randomPage(namesCollection(""), seeds.names);
        return () => `/do/objects?${query()}`;
      },
    ),
    row("getTaskObject", `GET /do/objects/<one of the 400 names holding ${records} tasks, big among them>`, () => {
      const name = cycle(LISTED_NAMES);
      return () => `/do/objects/${name()}`;
    }),
  ];
}

export const listWorkloads: Workload[] = [...listRows("1k"), ...listRows("100k")];

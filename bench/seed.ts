// Records the read workloads look up, created once over HTTP before the first round
// (lazily: only what the selected workloads need), and a readiness check of the service.
import { once } from "./children.ts";
import { inPool } from "./nats-load.ts";
import { pause } from "./stats.ts";

export interface DoTask {
  name: string;
  id: string;
}

export interface Seeds {
  taskIds(): Promise<string[]>;
  doTasks(): Promise<DoTask[]>;
  jobIds(): Promise<string[]>;
}

export interface SeedOptions {
  taskUrl: string;
  jobUrl: string;
  /** Records per kind (e.g. 1000). */
  count: number;
  /** Task objects the `/do` workloads spread over (e.g. 20). */
  objectNames: string[];
}

/**
 * Answers worth another try while seeding: the service is busy (a 504's create may be done; a spare record is
 * harmless).
 */
const BUSY = new Set([503, 504]);
const SEED_ATTEMPTS = 3;

async function postJson(url: string, body: unknown, attempts = 1): Promise<unknown> {
  for (let n = 1; ; n++) {
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status === 200) return JSON.parse(text);
    if (n >= attempts || !BUSY.has(res.status))
      throw new Error(`POST ${url} answered ${res.status}: ${text.slice(0, 200)}`);
    await pause(1_000);
  }
}

/** `count` new tasks over HTTP, `concurrency` creates in flight: their ids. */
export function seedTasks(taskUrl: string, count: number, concurrency = 32): Promise<string[]> {
  return inPool(
    count,
    concurrency,
    async () => ((await postJson(`${taskUrl}/`, { title: "bench" }, SEED_ATTEMPTS)) as { id: string }).id,
  );
}

/** `count` new tasks spread over the task objects `objectNames` in turn. */
export function seedDoTasks(
  taskUrl: string,
  objectNames: string[],
  count: number,
  concurrency = 32,
): Promise<DoTask[]> {
  return inPool(count, concurrency, async (i) => {
    const name = objectNames[i % objectNames.length]!;
    const task = (await postJson(`${taskUrl}/do?name=${name}`, { title: "bench" }, SEED_ATTEMPTS)) as { id: string };
    return { name, id: task.id };
  });
}

export function createSeeds(options: SeedOptions): Seeds {
  const { taskUrl, jobUrl, count, objectNames } = options;
  return {
    taskIds: once(() => seedTasks(taskUrl, count)),
    doTasks: once(() => seedDoTasks(taskUrl, objectNames, count)),
    jobIds: once(() => inPool(count, 32, async () => (await postJson(`${jobUrl}/`, { content: "bench" })) as string)),
  };
}

/** Resolves once a create goes through end to end (the actors may start after the gateway). */
export async function waitForService(taskUrl: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await postJson(`${taskUrl}/`, { title: "bench-ready" });
      return;
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`the service never created a task: ${(err as Error).message}`);
      await pause(200);
    }
  }
}

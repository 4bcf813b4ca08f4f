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

async function postJson(url: string, body: unknown): Promise<unknown> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`POST ${url} answered ${res.status}: ${text.slice(0, 200)}`);
  return JSON.parse(text);
}

export function createSeeds(options: SeedOptions): Seeds {
  const { taskUrl, jobUrl, count, objectNames } = options;
  return {
    taskIds: once(() =>
      inPool(count, 32, async () => ((await postJson(`${taskUrl}/`, { title: "bench" })) as { id: string }).id),
    ),
    doTasks: once(() =>
      inPool(count, 32, async (i) => {
        const name = objectNames[i % objectNames.length]!;
        const task = (await postJson(`${taskUrl}/do?name=${name}`, { title: "bench" })) as { id: string };
        return { name, id: task.id };
      }),
    ),
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

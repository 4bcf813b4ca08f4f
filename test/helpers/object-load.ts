// Steady task-object load for fault tests: one worker per name, each creating a task (retried
// with one Idempotency-Key until answered 200) and reading it back, through HTTP gateways.
import { ClientError, httpClient } from "../../client/index.ts";
import { taskApi } from "../../schemas/index.ts";

/** A create answered 200: it must be readable for ever after. */
export interface AnsweredWrite {
  name: string;
  id: string;
  title: string;
  at: number;
}

/** One attempt's outcome: when, which name, and the status or failure tag. */
export interface Attempt {
  name: string;
  at: number;
  ok: boolean;
  outcome: string;
}

export interface ObjectLoad {
  readonly answered: AnsweredWrite[];
  readonly attempts: Attempt[];
  /** Stops the workers after their current request. */
  stop(): Promise<void>;
}

const REQUEST_TIMEOUT_MS = 8_000;
const RETRY_PAUSE_MS = 100;

/** Starts one worker per name; worker i talks to gateway i mod n. */
export function startObjectLoad(names: readonly string[], gatewayUrls: readonly string[]): ObjectLoad {
  const answered: AnsweredWrite[] = [];
  const attempts: Attempt[] = [];
  let running = true;
  const fetchWithTimeout: typeof fetch = (input, init) => fetch(input, { ...init, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
  const clients = gatewayUrls.map((url) => httpClient(taskApi, url, { fetch: fetchWithTimeout }));

  /** Repeats `call` until it answers 200 or the load stops. */
  async function untilAnswered<T>(name: string, call: () => Promise<T>): Promise<T | undefined> {
    while (running) {
      try {
        const value = await call();
        attempts.push({ name, at: Date.now(), ok: true, outcome: "200" });
        return value;
      } catch (err) {
        const outcome = err instanceof ClientError ? `${err.status} ${err._tag}` : (err as Error).name;
        attempts.push({ name, at: Date.now(), ok: false, outcome });
        await new Promise((r) => setTimeout(r, RETRY_PAUSE_MS));
      }
    }
    return undefined;
  }

  async function worker(name: string, index: number): Promise<void> {
    const api = clients[index % clients.length]!;
    for (let n = 0; running; n++) {
      const title = `${name} #${n}`;
      const idempotencyKey = crypto.randomUUID();
      const task = await untilAnswered(name, () => api.createTaskDO({ title, name }, { idempotencyKey }));
      if (!task) return;
      answered.push({ name, id: task.id, title, at: Date.now() });
      const read = await untilAnswered(name, () => api.getTaskDO({ id: task.id, name }));
      if (read && (read.id !== task.id || read.title !== title)) throw new Error(`${name}: read ${JSON.stringify(read)} for ${JSON.stringify(task)}`);
    }
  }

  const workers = names.map((name, i) => worker(name, i));
  return {
    answered,
    attempts,
    async stop() {
      running = false;
      await Promise.all(workers);
    },
  };
}

/**
 * The longest time any name went without a 200 across `since` (ms): for each name, the widest
 * gap between consecutive successes (before `until`) that ends after `since`; undefined while
 * a name has no success after `since`.
 */
export function longestOutage(
  attempts: readonly Attempt[],
  names: readonly string[],
  since: number,
  until = Number.POSITIVE_INFINITY,
): { ms: number; name: string } | undefined {
  let worst = { ms: 0, name: "" };
  for (const name of names) {
    const successes = attempts.filter((a) => a.name === name && a.ok && a.at < until).map((a) => a.at);
    const firstAfter = successes.findIndex((at) => at >= since);
    if (firstAfter < 0) return undefined;
    for (let i = Math.max(1, firstAfter); i < successes.length; i++) {
      const gap = successes[i]! - successes[i - 1]!;
      if (gap > worst.ms) worst = { ms: gap, name };
    }
  }
  return worst;
}

/** Failures after `since` (and before `until`), as `3 × 503 ServiceUnavailable, …`. */
export function failureTally(attempts: readonly Attempt[], since: number, until = Number.POSITIVE_INFINITY): string {
  const counts = new Map<string, number>();
  for (const a of attempts) if (!a.ok && a.at >= since && a.at < until) counts.set(a.outcome, (counts.get(a.outcome) ?? 0) + 1);
  return [...counts].map(([outcome, n]) => `${n} × ${outcome}`).join(", ") || "none";
}

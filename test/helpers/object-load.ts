// Steady task-object load for fault tests: one worker per name, each creating a task (retried
// with one Idempotency-Key until answered 200), reading it back and, with `updates`, completing
// it (retried with If-Match of the create's revision until answered), through HTTP gateways.
// Every attempt is recorded, so a read of an acknowledged create that answered 404 is seen.
import assert from "node:assert/strict";
import { ClientError, httpClient } from "../../client/index.ts";
import { bucketNames } from "../../platform/index.ts";
import { taskApi } from "../../schemas/index.ts";

/** A create answered 200: it must be readable for ever after. */
export interface AnsweredWrite {
  name: string;
  id: string;
  title: string;
  at: number;
  /** Its update (`<title> done`, completed) was answered 200: it must be what reads answer for ever after. */
  updated?: boolean;
}

/** One attempt's outcome: when, which name, and the status or failure tag. */
export interface Attempt {
  name: string;
  /** A create, a read of a create answered 200 (which must never answer 404), or an update of it. */
  kind: "create" | "read" | "update";
  at: number;
  ok: boolean;
  outcome: string;
  /** Index of the gateway that was asked. */
  via: number;
}

export interface ObjectLoad {
  readonly answered: AnsweredWrite[];
  readonly attempts: Attempt[];
  /** Stops the workers after their current request. */
  stop(): Promise<void>;
}

/** The buckets the load's creates write (a name's lease fence, then the record). */
export const objectLoadBuckets = [bucketNames.taskObjectLeases, bucketNames.taskObjects];

const REQUEST_TIMEOUT_MS = 8_000;
const RETRY_PAUSE_MS = 100;

export interface ObjectLoadOptions {
  /** Read each create back through the next gateway, not the one that answered it (default false). */
  readElsewhere?: boolean;
  /** API key for gateways that need one. */
  apiKey?: string;
  /** Complete each task after reading it (default false): updates in the workload. */
  updates?: boolean;
}

/** Starts one worker per name; worker i creates through gateway i mod n. */
export function startObjectLoad(
  names: readonly string[],
  gatewayUrls: readonly string[],
  options: ObjectLoadOptions = {},
): ObjectLoad {
  const { apiKey } = options;
  const answered: AnsweredWrite[] = [];
  const attempts: Attempt[] = [];
  let running = true;
  const fetchWithTimeout: typeof fetch = (input, init) =>
    fetch(input, { ...init, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
  const clients = gatewayUrls.map((url) => httpClient(taskApi, url, { fetch: fetchWithTimeout, apiKey }));

  /** Repeats `call` until it answers 200 or the load stops. */
  async function untilAnswered<T>(
    name: string,
    kind: Attempt["kind"],
    via: number,
    call: () => Promise<T>,
  ): Promise<T | undefined> {
    while (running) {
      try {
        const value = await call();
        attempts.push({ name, kind, at: Date.now(), ok: true, outcome: "200", via });
        return value;
      } catch (err) {
        const outcome = err instanceof ClientError ? `${err.status} ${err._tag}` : (err as Error).name;
        attempts.push({ name, kind, at: Date.now(), ok: false, outcome, via });
        await new Promise((r) => setTimeout(r, RETRY_PAUSE_MS));
      }
    }
    return undefined;
  }

  async function worker(name: string, index: number): Promise<void> {
    const writeVia = index % clients.length;
    const readVia = (index + (options.readElsewhere ? 1 : 0)) % clients.length;
    const [api, reader] = [clients[writeVia]!, clients[readVia]!];
    for (let n = 0; running; n++) {
      const title = `${name} #${n}`;
      const idempotencyKey = crypto.randomUUID();
      let revision = 0;
      const task = await untilAnswered(name, "create", writeVia, () =>
        api.createTaskDO({ title, name }, { idempotencyKey, onRevision: (r) => (revision = r) }),
      );
      if (!task) return;
      const write: AnsweredWrite = { name, id: task.id, title, at: Date.now() };
      answered.push(write);
      const read = await untilAnswered(name, "read", readVia, () => reader.getTaskDO({ id: task.id, name }));
      if (read && (read.id !== task.id || read.title !== title))
        throw new Error(`${name}: read ${JSON.stringify(read)} for ${JSON.stringify(task)}`);
      if (options.updates && read) write.updated = await complete(api, reader, write, revision, writeVia);
    }
  }

  /**
   * Completes `write` at the create's `revision`, until answered: a 412 after an attempt whose
   * answer was lost is that attempt applied (once: the retry is refused), when the task reads done.
   */
  async function complete(
    api: (typeof clients)[number],
    reader: (typeof clients)[number],
    write: AnsweredWrite,
    revision: number,
    via: number,
  ): Promise<boolean> {
    const { name, id } = write;
    const done = { id, name, title: `${write.title} done`, completed: true };
    // One key for every attempt: a repeat after a lost answer answers the first write.
    const idempotencyKey = crypto.randomUUID();
    const outcome = await untilAnswered(name, "update", via, async () => {
      try {
        return { updated: await api.updateTaskDO(done, { ifMatch: revision, idempotencyKey }) };
      } catch (err) {
        if (!(err instanceof ClientError) || err.status !== 412) throw err;
        return { refused: await reader.getTaskDO({ id, name }) };
      }
    });
    // Refused, and not done: another write moved it (which the load never sends).
    const refused = outcome && "refused" in outcome ? outcome.refused : undefined;
    if (refused && (refused.title !== done.title || !refused.completed))
      throw new Error(`${name}: ${id} moved to ${JSON.stringify(refused)} by another write`);
    return outcome !== undefined;
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
 * Whether `task` is what the load's answered `write` must read as now: done once its update
 * was answered (applied once: its If-Match refused a second); either, if not answered.
 */
export function readsAsWritten(write: AnsweredWrite, task: { id: string; title: string; completed: boolean }): boolean {
  const done = { id: write.id, title: `${write.title} done`, completed: true };
  const created = { id: write.id, title: write.title, completed: false };
  const same = (a: typeof task, b: typeof task) => a.id === b.id && a.title === b.title && a.completed === b.completed;
  return same(task, done) || (!write.updated && same(task, created));
}

/**
 * Reads of an acknowledged create that answered 404 (a stale read, e.g. from a replica behind
 * after a failover): the load retries them until 200, so they are only seen here.
 */
export function staleReads(attempts: readonly Attempt[]): Attempt[] {
  return attempts.filter((a) => a.kind === "read" && a.outcome.startsWith("404"));
}

/** Reports how many reads of acknowledged creates were made, and fails on any stale one. */
export function assertNoStaleReads(attempts: readonly Attempt[], say: (line: string) => void): void {
  const stale = staleReads(attempts);
  const reads = attempts.filter((a) => a.kind === "read").length;
  say(`${reads} reads of acknowledged creates under load, ${stale.length} answered 404`);
  assert.deepEqual(stale, [], "no read of an acknowledged create answered 404");
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
  for (const a of attempts)
    if (!a.ok && a.at >= since && a.at < until) counts.set(a.outcome, (counts.get(a.outcome) ?? 0) + 1);
  return [...counts].map(([outcome, n]) => `${n} × ${outcome}`).join(", ") || "none";
}

/** How the load fared across a fault: the longest time a name went without a 200, and the failures. */
export interface Recovery {
  ms: number;
  name: string;
  failures: string;
}

/**
 * After a fault at `since`: waits until `boundMs` past it, then until every name has answered 200
 * again (throwing 30 s past the bound), and measures the longest outage of a name across the fault.
 */
export async function recoveryAfter(
  load: ObjectLoad,
  names: readonly string[],
  since: number,
  boundMs: number,
): Promise<Recovery> {
  await new Promise((r) => setTimeout(r, Math.max(0, since + boundMs - Date.now())));
  const checkpoint = Date.now();
  const answeringAgain = () =>
    names.every((name) => load.attempts.some((a) => a.name === name && a.ok && a.at >= checkpoint));
  for (const deadline = checkpoint + 30_000; !answeringAgain(); await new Promise((r) => setTimeout(r, 200))) {
    if (Date.now() > deadline)
      throw new Error(`names still failing 30 s after the bound: ${failureTally(load.attempts, since)}`);
  }
  const outage = longestOutage(load.attempts, names, since, Date.now())!;
  return { ...outage, failures: failureTally(load.attempts, since) };
}

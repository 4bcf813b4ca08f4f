// The runners workloads are built from: HTTP requests cycled, fixed, or (deletes) each sent
// once from a pool of records seeded before every load, outside its measurement.
import { runHttpLoad, runHttpPoolLoad } from "./http-load.ts";
import type { HttpRequestSpec, LoadResult, LoadSettings } from "./types.ts";

/** One load of a workload; `beforeEach`, when present, readies the next load and is not measured. */
export type Runner = ((settings: LoadSettings) => Promise<LoadResult>) & {
  beforeEach?(settings: LoadSettings): Promise<void>;
};

/** Cycles through `items` across calls. */
export function cycle<T>(items: readonly T[]): () => T {
  if (items.length === 0) throw new Error("nothing to cycle over: the seeding created no records");
  let i = 0;
  return () => items[i++ % items.length]!;
}

export function http(url: string, next: () => HttpRequestSpec, expectedStatus?: number): Runner {
  return (settings) => runHttpLoad({ url, next, expectedStatus }, settings);
}

/** The same request every time. */
export function httpFixed(url: string, request: HttpRequestSpec): Runner {
  return (settings) => runHttpLoad({ url, next: () => request, fixed: true }, settings);
}

/** The rate a pool is sized for until its workload has been measured once. */
const FIRST_GUESS_RPS = 5_000;
/** Requests pooled per request the fastest load so far would send: a warm service is faster. */
const POOL_MARGIN = 2;

/**
 * Each request sent once, from a pool that `seed(count)` tops up before every load to twice
 * what the fastest load so far would send (the rest waits for the next load). A load that
 * still runs out fails, since its connections idled: the next one gets a larger pool.
 */
export function pooled(url: string, seed: (count: number) => Promise<HttpRequestSpec[]>): Runner {
  let pool: HttpRequestSpec[] = [];
  let fastestRps = 0;
  const run: Runner = async (settings) => {
    const requests = pool;
    pool = [];
    const result = await runHttpPoolLoad({ url, requests }, settings);
    pool = result.unsent;
    fastestRps = Math.max(fastestRps, result.rps);
    if (result.exhausted)
      throw new Error(
        `its ${requests.length} seeded records ran out within ${settings.duration} s (${Math.round(result.rps)} ` +
          `req/s); the next load gets more`,
      );
    const { unsent: _, exhausted: __, ...load } = result;
    return load;
  };
  run.beforeEach = async (settings) => {
    // wrk runs whole seconds, at least one.
    const seconds = Math.max(1, Math.round(settings.duration));
    const wanted = Math.ceil((fastestRps || FIRST_GUESS_RPS) * seconds * POOL_MARGIN) + settings.connections;
    if (pool.length < wanted) pool.push(...(await seed(wanted - pool.length)));
  };
  return run;
}

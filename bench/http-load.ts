// HTTP load: `wrk` when installed (its own process, the cheaper driver), else autocannon
// driven from this process: a fixed duration, N keep-alive connections, and per-request
// paths or bodies from `next()`. Latency counts non-2xx answers (the expected 404s) too.
import autocannon from "autocannon";
import type { EventEmitter } from "node:events";
import { createTally } from "./latency.ts";
import type { HttpLoadSpec, HttpPoolSpec, LoadResult, LoadSettings, PoolLoadResult } from "./types.ts";
import { runWrkLoad, runWrkPoolLoad, wrkVersion } from "./wrk-load.ts";

export type HttpDriverName = "wrk" | "autocannon";

/** The load generator the HTTP workloads use, and its version. */
export interface HttpDriver {
  name: HttpDriverName;
  version: string;
}

let chosen: HttpDriver | undefined;

/** Picks the driver once: `wanted` when given (wrk must then be installed), else wrk if installed. */
export function chooseHttpDriver(wanted?: HttpDriverName): HttpDriver {
  const wrk = wanted === "autocannon" ? undefined : wrkVersion();
  if (wanted === "wrk" && !wrk) throw new Error("--driver wrk: wrk is not installed (Debian: apt-get install wrk)");
  chosen = wrk ? { name: "wrk", version: wrk } : { name: "autocannon", version: `autocannon (in the bench process)` };
  return chosen;
}

const jsonHeaders = { "content-type": "application/json" };

export function runHttpLoad(spec: HttpLoadSpec, settings: LoadSettings): Promise<LoadResult> {
  return (chosen ?? chooseHttpDriver()).name === "wrk" ? runWrkLoad(spec, settings) : runAutocannonLoad(spec, settings);
}

/**
 * Sends each of `spec.requests` at most once. Under autocannon, which cannot stop early, the
 * requests past the pool's end go to a path that answers 404, counted as non-2xx.
 */
export async function runHttpPoolLoad(spec: HttpPoolSpec, settings: LoadSettings): Promise<PoolLoadResult> {
  if ((chosen ?? chooseHttpDriver()).name === "wrk") return runWrkPoolLoad(spec, settings);
  let i = 0;
  const past = { method: "GET", path: "/bench-pool-exhausted" } as const;
  const result = await runAutocannonLoad({ url: spec.url, next: () => spec.requests[i++] ?? past }, settings);
  return { ...result, exhausted: i > spec.requests.length, unsent: spec.requests.slice(i) };
}

function runAutocannonLoad(spec: HttpLoadSpec, settings: LoadSettings): Promise<LoadResult> {
  const tally = createTally(spec.expectedStatus);
  const first = spec.next();
  const setupRequest = (request: autocannon.Request): autocannon.Request => {
    const { method, path, body } = spec.next();
    return { ...request, method, path, body, headers: body === undefined ? {} : jsonHeaders };
  };
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url: spec.url,
        connections: settings.connections,
        duration: settings.duration,
        timeout: 10,
        requests: [
          {
            method: first.method,
            path: first.path,
            body: first.body,
            headers: first.body === undefined ? {} : jsonHeaders,
            // Present only when dynamic: autocannon calls any `setupRequest` key it finds.
            ...(spec.fixed ? {} : { setupRequest }),
          },
        ],
      },
      (err) => {
        if (err) reject(err);
        else resolve(tally.result((performance.now() - started) / 1000));
      },
    );
    // The instance re-emits each client's response as (client, status, bytes, ms).
    (instance as unknown as EventEmitter).on("response", (_client, status: number, _bytes, ms: number) =>
      tally.answer(status, ms),
    );
    instance.on("reqError", (err: Error) => tally.fail(err, err?.message === "request timed out"));
  });
}

// Shapes shared by the benchmark's pieces: load settings, one load's result, and one
// measured workload (the load plus the service's and nats-server's RSS and CPU meanwhile).

/** How hard and how long one load runs. */
export interface LoadSettings {
  /** HTTP connections, or NATS requests in flight. */
  connections: number;
  /** Seconds. */
  duration: number;
}

/** What a load generator saw. Latencies in milliseconds. */
export interface LoadResult {
  /** Completed requests (any status). */
  requests: number;
  seconds: number;
  rps: number;
  p50: number;
  p99: number;
  /** Socket errors and timeouts (no status at all). */
  errors: number;
  timeouts: number;
  /** Statuses that were neither 2xx nor the workload's expected status. */
  unexpected: number;
  /** Answers with the workload's expected non-2xx status (the 404s of a missing-id read). */
  expected: number;
  /** Count per status code; NATS replies count as 200 or their error-code header. */
  statusCodes: Record<string, number>;
  /** A few distinct error messages, to say why `errors` is not 0. */
  errorSamples: string[];
}

/** Peak RSS (MiB) and CPU seconds of each process group while a load ran. */
export interface ProcessUsage {
  rssMiB: Record<string, number>;
  cpuSeconds: Record<string, number>;
  /** The machine's busy CPU seconds (all cores, every process) over the same span; NaN without /proc. */
  machineCpuSeconds: number;
}

export type Measurement = LoadResult & ProcessUsage;

/** Pids by group; the groups the table reports are `service` and `nats`. */
export type ProcessGroups = Record<string, number[]>;

/** One HTTP request of a load run. */
export interface HttpRequestSpec {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  path: string;
  body?: string;
}

export interface HttpLoadSpec {
  /** Origin, e.g. `http://127.0.0.1:8787`. */
  url: string;
  /** The request to send next; called once per request unless `fixed`. */
  next(): HttpRequestSpec;
  /** Every request is the same: built once, which keeps the load generator's cost down. */
  fixed?: boolean;
  /** A non-2xx status that is the right answer (404 for a missing id). */
  expectedStatus?: number;
}

/** Requests each sent at most once, e.g. deletes of records seeded for them. */
export interface HttpPoolSpec {
  url: string;
  requests: HttpRequestSpec[];
}

/** A pool load's result: `exhausted` when the pool ran out before the duration did; the requests not sent. */
export type PoolLoadResult = LoadResult & { exhausted: boolean; unsent: HttpRequestSpec[] };

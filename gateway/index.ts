// Public entry of the gateway: HTTP APIs derived from the contracts, forwarding over NATS.
import { jobApi, microvmApi, taskApi } from "../schemas/index.ts";
import type { NatsHandle, RecordStores } from "../platform/index.ts";
import { localReads } from "./local-reads.ts";
import { ownerRouting } from "./owner-routing.ts";
import { createApiServer, type ApiServer } from "./server.ts";

export { createApiServer, type ApiServer, type ApiServerOptions } from "./server.ts";
export { opsListener } from "./health.ts";

export interface GatewayOptions {
  nats: NatsHandle;
  prefix?: string;
  /** Largest request body in bytes (default 1 MiB). */
  bodyLimit?: number;
  /** Time for an actor's answer (default 5 s). */
  requestTimeoutMs?: number;
  /**
   * When given, reads are served from these stores in the gateway (no actor hop), and
   * task-object requests go straight to their owner (read from the lease bucket).
   */
  stores?: RecordStores;
  /** Most cached read answers (default 50,000; 0 turns the cache off). */
  readCacheEntries?: number;
  /** Slow-client bounds (defaults: headers 10 s, whole request 30 s, keep-alive 5 s). */
  timeouts?: { headersMs?: number; requestMs?: number; keepAliveMs?: number };
}

const info = (title: string) => ({ title, version: "1.0.0" });

/** The Task API (with CORS), the Job API and the microVM API, not yet listening. */
export function createGateways(options: GatewayOptions): { task: ApiServer; job: ApiServer; microvm: ApiServer } {
  const common = {
    nats: options.nats,
    prefix: options.prefix ?? "",
    bodyLimit: options.bodyLimit ?? 1024 * 1024,
    requestTimeoutMs: options.requestTimeoutMs ?? 5_000,
    timeouts: options.timeouts,
    localReads: options.stores && localReads({ stores: options.stores, cacheEntries: options.readCacheEntries }),
    ownerRouting: options.stores && ownerRouting(options.nats, options.stores.taskObjectLeases, options.prefix ?? ""),
  };
  return {
    task: createApiServer({ ...common, operations: Object.values(taskApi), cors: true, info: info("Task API") }),
    job: createApiServer({ ...common, operations: Object.values(jobApi), info: info("Job API") }),
    microvm: createApiServer({ ...common, operations: Object.values(microvmApi), info: info("MicroVM API") }),
  };
}

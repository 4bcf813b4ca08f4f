// Public entry of the gateway: HTTP APIs derived from the contracts, forwarding over NATS. A
// generic adapter: what it may answer itself (storage reads) and how it finds owners (a routing
// policy) are handed in by `main.ts`; it knows only the contracts and the platform.
import { jobApi, microvmApi, taskApi, type StorageReads } from "../schemas/index.ts";
import { changeFedBucketNames, type NatsHandle } from "../platform/index.ts";
import { followChanges } from "./change-feed.ts";
import type { ApiKeys, ReloadableApiKeys } from "./api-keys.ts";
import { openStreams } from "./open-streams.ts";
import { revokeOnReload } from "./revocations.ts";
import { localReads, type LocalReads } from "./local-reads.ts";
import { dispatcher, withInProcess, type InProcessRoute, type RoutingPolicy } from "../placement/index.ts";
import { createApiServer, type ApiServer } from "./server.ts";

export { createApiServer, type ApiServer, type ApiServerOptions } from "./server.ts";
export { READ_CACHE_STALE_MS, type LocalReads } from "./local-reads.ts";
export { opsListener } from "./health.ts";
export {
  isLoopback,
  loadApiKeys,
  newApiKey,
  parseApiKeys,
  sha256Hex,
  type ApiKeys,
  type ReloadableApiKeys,
} from "./api-keys.ts";

/** Every operation the gateways serve. */
export type GatewayApi = typeof taskApi & typeof jobApi & typeof microvmApi;

export interface GatewayOptions {
  nats: NatsHandle;
  prefix?: string;
  /** Largest request body in bytes (default 1 MiB). */
  bodyLimit?: number;
  /** Time for an actor's answer (default 5 s). */
  requestTimeoutMs?: number;
  /**
   * Reads the gateway answers from storage itself (no actor hop), for operations whose contract
   * declares `reads`; an `immutable` or `versioned` one's found answers are kept (see local-reads.ts).
   */
  storageReads?: StorageReads<GatewayApi>;
  /** How owners of owned operations are found: their requests then go straight to the owner. */
  routing?: RoutingPolicy;
  /** Most cached read answers (default 50,000; 0 turns the cache off). */
  readCacheEntries?: number;
  /** Slow-client bounds (defaults: headers 10 s, whole request 30 s, keep-alive 5 s). */
  timeouts?: { headersMs?: number; requestMs?: number; keepAliveMs?: number };
  /**
   * API keys (`API_KEYS_FILE`): every API then needs a bearer key. Keys a reload removes end
   * what they hold open here and are recorded for the microVM hosts.
   */
  apiKeys?: ApiKeys | ReloadableApiKeys;
  /**
   * `Host` names every API answers to besides `localhost`, 127.0.0.1 and ::1 (always served);
   * any other name is 421 MisdirectedRequest, on loopback too (DNS rebinding).
   */
  hostNames?: readonly string[];
  /** Further `Host` names only the microVM API answers to. */
  microvmHostNames?: readonly string[];
  /**
   * Operations this process serves itself, by name (`ActorsHandle.inProcess`,
   * `MicrovmHost.inProcess`): those a route says are best served here skip the trip through NATS.
   */
  inProcess?: ReadonlyMap<string, InProcessRoute>;
}

const info = (title: string) => ({ title, version: "1.0.0" });

/** The Task API (with CORS), the Job API and the microVM API, not yet listening. */
export function createGateways(options: GatewayOptions): {
  task: ApiServer;
  job: ApiServer;
  microvm: ApiServer;
  /** The reads answered here, when `storageReads` is given (its `events` say when a write was seen). */
  reads?: LocalReads;
} {
  const reads =
    options.storageReads &&
    localReads({ reads: options.storageReads, cacheEntries: options.readCacheEntries, feed: true });
  if (reads) followChanges(options.nats, options.prefix ?? "", reads, { buckets: changeFedBucketNames });
  const streams = openStreams();
  if (options.apiKeys && "onRevoked" in options.apiKeys) revokeOnReload(options.apiKeys, options.nats, streams);
  const common = {
    nats: options.nats,
    prefix: options.prefix ?? "",
    bodyLimit: options.bodyLimit ?? 1024 * 1024,
    requestTimeoutMs: options.requestTimeoutMs ?? 5_000,
    timeouts: options.timeouts,
    localReads: reads,
    dispatch: withInProcess(dispatcher(options.nats, options.prefix ?? "", options.routing), options.inProcess, () =>
      options.nats.connected(),
    ),
    apiKeys: options.apiKeys,
    hostNames: options.hostNames,
    openStreams: streams,
  };
  return {
    reads,
    task: createApiServer({ ...common, operations: Object.values(taskApi), cors: true, info: info("Task API") }),
    job: createApiServer({ ...common, operations: Object.values(jobApi), info: info("Job API") }),
    // On the gateway-only subjects, with the caller's principal (its contracts' API says so); no CORS, JSON POSTs only.
    microvm: createApiServer({
      ...common,
      operations: Object.values(microvmApi),
      info: info("MicroVM API"),
      jsonOnly: true,
      hostNames: [...(options.hostNames ?? []), ...(options.microvmHostNames ?? [])],
    }),
  };
}

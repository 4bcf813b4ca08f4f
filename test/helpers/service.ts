// The whole service in the test process: private NATS, actors, and both HTTP APIs on port 0.
import { headers as natsHeaders } from "@nats-io/transport-node";
import { backfillIndexes, gatewayDispatch, NATS_INTERNAL, startActors, type ActorOptions } from "../../actors/index.ts";
import { createGateways, type ApiKeys } from "../../gateway/index.ts";
import { connectNats, provisionBuckets, recordStores, type Buckets, type NatsHandle } from "../../platform/index.ts";
import type { Defer } from "./defer.ts";
import { testNats, type TestNats } from "./nats.ts";

export interface TestService {
  nats: TestNats;
  /** The test's own connection (user `admin`): to set up and inspect, never the service's. */
  handle: NatsHandle;
  buckets: Buckets;
  taskUrl: string;
  jobUrl: string;
}

export interface ServiceOptions {
  bodyLimit?: number;
  requestTimeoutMs?: number;
  /** Start the actors (default true); false leaves subjects without responders. */
  actors?: boolean;
  prefix?: string;
  /** Serve reads in the gateway (default true, as `npm start` does). */
  localReads?: boolean;
  /** Slow-client bounds of the HTTP servers. */
  timeouts?: { headersMs?: number; requestMs?: number; keepAliveMs?: number };
  /** Task-object placement settings of the actors. */
  placement?: ActorOptions["placement"];
  /** API keys: every request then needs a bearer key. */
  apiKeys?: ApiKeys;
  /**
   * The principal of NATS callers on the public subjects (default as `npm start`: `nats:internal` with API keys, else
   * anonymous).
   */
  natsPrincipal?: string;
  /**
   * The gateway hands the actors beside it their requests in this process (as `npm start` does),
   * instead of over NATS (default false: the tests of the actor hop).
   */
  inProcess?: boolean;
  /** Writes a previous release's records before the actors start (the backfill at start then indexes them). */
  earlier?: (buckets: Awaited<ReturnType<typeof provisionBuckets>>) => Promise<void>;
}

export async function startService(defer: Defer, options: ServiceOptions = {}): Promise<TestService> {
  const nats = await testNats(defer);
  const handle = await connectNats({ ...nats.login("admin"), name: "test" });
  defer(() => handle.close());
  const buckets = await provisionBuckets(handle.nc);
  await options.earlier?.(buckets);
  // The service's pieces run as their own NATS users, as `npm start` runs them.
  const actorsNats = await connectNats({ ...nats.login("actors"), name: "test:actors" });
  defer(() => actorsNats.close());
  const gatewayNats = await connectNats({ ...nats.login("gateway"), name: "test:gateway" });
  defer(() => gatewayNats.close());
  // As at start: records of an earlier release get their places in the lists first.
  if (options.actors !== false) await backfillIndexes(actorsNats.requester);
  const actors =
    options.actors === false
      ? undefined
      : startActors(actorsNats.nc, recordStores(actorsNats.requester), {
          prefix: options.prefix,
          publisher: actorsNats.publisher,
          requester: actorsNats.requester,
          placement: options.placement,
          natsPrincipal: options.natsPrincipal ?? (options.apiKeys ? NATS_INTERNAL : undefined),
        });
  await actorsNats.nc.flush(); // the actors' subscriptions are known to the server before any request
  const { inProcess, ...gatewayOptions } = options;
  const gateways = createGateways({
    nats: gatewayNats,
    ...gatewayOptions,
    ...(options.localReads === false ? {} : gatewayDispatch(recordStores(gatewayNats.requester))),
    ...(inProcess && actors ? { inProcess: actors.inProcess } : {}),
  });
  const taskPort = await gateways.task.listen(0, "127.0.0.1");
  const jobPort = await gateways.job.listen(0, "127.0.0.1");
  defer(() => actors?.close());
  defer(() => gateways.job.close());
  defer(() => gateways.task.close());
  return {
    nats,
    handle,
    buckets,
    taskUrl: `http://127.0.0.1:${taskPort}`,
    jobUrl: `http://127.0.0.1:${jobPort}`,
  };
}

/** POSTs JSON and returns status, headers and the parsed body. */
export async function postJson(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: await readBody(res) };
}

export async function getJson(url: string) {
  const res = await fetch(url);
  return { status: res.status, headers: res.headers, body: await readBody(res) };
}

async function readBody(res: Response): Promise<unknown> {
  const text = await res.text();
  try {
    return text ? JSON.parse(text) : undefined;
  } catch {
    return text;
  }
}

/** A request over NATS as the test's own user: the error code, the `Revision` header and the JSON body. */
export async function natsRequest(
  svc: TestService,
  subject: string,
  body: unknown,
  headerValues: Record<string, string> = {},
) {
  const hdrs = natsHeaders();
  for (const [k, v] of Object.entries(headerValues)) hdrs.set(k, v);
  const msg = await svc.handle.nc.request(subject, JSON.stringify(body), { timeout: 5_000, headers: hdrs });
  return {
    code: msg.headers?.get("Nats-Service-Error-Code") ?? "",
    revision: msg.headers?.get("Revision") ?? "",
    body: msg.json<Record<string, unknown> | null>(),
  };
}

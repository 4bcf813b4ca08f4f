// The whole service in the test process: private NATS, actors, and both HTTP APIs on port 0.
import { startActors, type ActorOptions } from "../../actors/index.ts";
import { createGateways } from "../../gateway/index.ts";
import { connectNats, openBuckets, recordStores, type Buckets, type NatsHandle } from "../../platform/index.ts";
import type { Defer } from "./defer.ts";
import { testNats, type TestNats } from "./nats.ts";

export interface TestService {
  nats: TestNats;
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
}

export async function startService(defer: Defer, options: ServiceOptions = {}): Promise<TestService> {
  const nats = await testNats(defer);
  const handle = await connectNats({ servers: nats.url, name: "test" });
  const buckets = await openBuckets(handle.nc);
  const actors = options.actors === false ? undefined : startActors(handle.nc, recordStores(handle.requester), { prefix: options.prefix, publisher: handle.publisher, requester: handle.requester, placement: options.placement });
  const gateways = createGateways({ nats: handle, ...options, stores: options.localReads === false ? undefined : recordStores(handle.requester) });
  const taskPort = await gateways.task.listen(0, "127.0.0.1");
  const jobPort = await gateways.job.listen(0, "127.0.0.1");
  defer(() => handle.close());
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

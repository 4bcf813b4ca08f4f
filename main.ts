// Process entry: reads env and flags, connects to NATS (or starts a private nats-server),
// and runs the roles asked for: gateway, actors, microvms (default: all in one process).
import { parseArgs } from "node:util";
import { resolve, join } from "node:path";
import { writeFile } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import { startActors, startMicrovmHost } from "./actors/index.ts";
import { createServer } from "node:http";
import { once } from "node:events";
import { createGateways, opsListener } from "./gateway/index.ts";
import {
  connectNats,
  log,
  openBuckets,
  recordStores,
  startNatsServer,
  stopStaleServer,
  type NatsServer,
} from "./platform/index.ts";

const roles = ["gateway", "actors", "microvms"] as const;
type Role = (typeof roles)[number];

const env = process.env;
const config = {
  natsUrl: env.NATS_URL,
  dataDir: resolve(env.DATA_DIR ?? ".data"),
  natsPort: int("NATS_PORT", 0),
  host: env.HOST ?? "127.0.0.1",
  taskPort: int("TASK_API_PORT", 8787),
  jobPort: int("JOB_API_PORT", 8788),
  microvmPort: int("MICROVM_API_PORT", 8789),
  prefix: env.NATS_SUBJECT_PREFIX ?? "",
  bodyLimit: int("BODY_LIMIT_BYTES", 1024 * 1024),
  requestTimeoutMs: int("REQUEST_TIMEOUT_MS", 5_000),
  replicas: int("KV_REPLICAS", 1),
  localReads: env.GATEWAY_LOCAL_READS !== "0",
  metricsPort: env.METRICS_PORT ? int("METRICS_PORT", 0) : undefined,
  readCacheEntries: int("READ_CACHE_ENTRIES", 50_000),
};

/** Task-object placement (role `actors`): lease TTL and idle release. */
const placementConfig = {
  ttlMs: int("TASK_OBJECT_LEASE_MS", 2_000) || fail("TASK_OBJECT_LEASE_MS must be positive"),
  idleMs: int("TASK_OBJECT_IDLE_MS", 30_000),
  logWrites: env.TASK_OBJECT_LOG_WRITES === "1",
};

/** The microVM host (role `microvms`). The token secret is never logged. */
const microvmHost = {
  hostId: env.MICROVM_HOST_ID || undefined,
  tokenSecret: env.MICROVM_TOKEN_SECRET || undefined,
  maxInstances: int("MICROVM_MAX_INSTANCES", 50),
  retentionSeconds: int("MICROVM_RETENTION_SECONDS", 600),
  proxyHost: env.MICROVM_PROXY_HOST || "127.0.0.1",
  proxyBindHost: env.MICROVM_PROXY_BIND || undefined,
};

function int(name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0) fail(`${name} must be a non-negative integer, got "${raw}"`);
  return value;
}

function fail(message: string): never {
  console.error(`error: ${message}`);
  process.exit(1);
}

function selectedRoles(): Set<Role> {
  const { values } = parseArgs({ options: { role: { type: "string", multiple: true } } });
  const asked = (values.role ?? []).flatMap((r) => r.split(","));
  if (asked.length === 0 || asked.includes("all")) return new Set(roles);
  for (const r of asked) if (!roles.includes(r as Role)) fail(`unknown role "${r}" (use ${roles.join(", ")} or all)`);
  return new Set(asked as Role[]);
}

async function privateNatsServer(): Promise<NatsServer> {
  try {
    execFileSync("nats-server", ["--version"], { stdio: "ignore" });
  } catch {
    fail("NATS_URL is not set and nats-server is not on PATH: install it (Debian/Ubuntu: apt-get install nats-server) or set NATS_URL");
  }
  const dir = join(config.dataDir, "nats");
  const pidFile = join(config.dataDir, "nats-server.pid");
  await stopStaleServer(pidFile);
  const server = await startNatsServer({ storeDir: dir, port: config.natsPort });
  await writeFile(pidFile, String(server.pid));
  await writeFile(join(config.dataDir, "nats-url"), server.url);
  log.info({ url: server.url, storeDir: dir }, "started private nats-server");
  return server;
}

async function main() {
  const active = selectedRoles();
  const server = config.natsUrl ? undefined : await privateNatsServer();
  const servers = config.natsUrl ?? server!.url;
  const nats = await connectNats({ servers, name: `service:${[...active].join("+")}` }).catch((err) =>
    fail(`cannot connect to NATS at ${servers}: ${(err as Error).message}`),
  );
  const closers: (() => Promise<void>)[] = [];

  if (active.has("actors")) {
    await openBuckets(nats.nc, { replicas: config.replicas });
    const actors = startActors(nats.nc, recordStores(nats.requester, { replicas: config.replicas }), { prefix: config.prefix, publisher: nats.publisher, requester: nats.requester, placement: placementConfig });
    closers.push(() => actors.close());
    log.info({ prefix: config.prefix }, "actors serving");
  }
  if (active.has("microvms")) {
    const { microvms } = await openBuckets(nats.nc, { replicas: config.replicas });
    const host = await startMicrovmHost(nats.nc, {
      kv: microvms,
      dataDir: config.dataDir,
      prefix: config.prefix,
      ...withoutUndefined(microvmHost),
    }).catch((err) => fail(`cannot start the microVM host: ${(err as Error).message}`));
    // Closed last: it terminates its instances once the gateway no longer routes requests.
    closers.push(() => host.close());
  }
  if (active.has("gateway")) {
    const stores = config.localReads ? recordStores(nats.requester, { replicas: config.replicas }) : undefined;
    const gateways = createGateways({ nats, ...config, stores });
    const taskPort = await gateways.task.listen(config.taskPort, config.host);
    const jobPort = await gateways.job.listen(config.jobPort, config.host);
    const microvmPort = await gateways.microvm.listen(config.microvmPort, config.host);
    closers.unshift(() => gateways.task.close(), () => gateways.job.close(), () => gateways.microvm.close());
    log.info({ taskPort, jobPort, microvmPort, host: config.host }, "gateway listening");
  } else if (config.metricsPort !== undefined) {
    // Processes without an API still expose /metrics, /livez and /readyz.
    const ops = createServer(opsListener(() => nats.connected()));
    ops.listen(config.metricsPort, config.host);
    await once(ops, "listening");
    closers.push(() => new Promise((done) => ops.close(() => done())));
    log.info({ metricsPort: (ops.address() as { port: number }).port }, "metrics listening");
  }

  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    for (const close of closers) await close().catch((err) => log.warn({ err }, "close failed"));
    await nats.close();
    await server?.stop();
    process.exit(0);
  };
  process.on("SIGINT", () => void shutdown("SIGINT"));
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
  log.info({ nats: servers, roles: [...active] }, "ready");
}

function withoutUndefined<T extends object>(value: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as never;
}

main().catch((err) => {
  log.fatal({ err }, "failed to start");
  process.exit(1);
});

// Process entry: reads env and flags, connects to NATS (or starts a private nats-server),
// and runs the roles asked for: gateway, actors, microvms (default: all in one process).
import { join } from "node:path";
import { mkdir, writeFile } from "node:fs/promises";
import { lookup } from "node:dns/promises";
import { backfillIndexes, gatewayDispatch, NATS_INTERNAL, startActors } from "./actors/index.ts";
import { ProviderUnavailable, provisionMicrovmStores, startMicrovmHost } from "./vm-runtime/service/index.ts";
import { createServer } from "node:http";
import type { InProcessRoute } from "./placement/index.ts";
import { ConfigError, readConfig, readFlags, usage, type Role } from "./config.ts";
import { once } from "node:events";
import { createGateways, isLoopback, loadApiKeys, opsListener, type ReloadableApiKeys } from "./gateway/index.ts";
import {
  actorBuckets,
  authDirOf,
  authorizationConfig,
  connectNats,
  credentialsFromEnv,
  readNatsCredentials,
  ensureNatsCredentials,
  log,
  natsServerPath,
  openBuckets,
  provisionBuckets,
  provisionerFromEnv,
  recordStores,
  startNatsServer,
  startTracing,
  stopStaleServer,
  acquireInstanceLock,
  AlreadyRunning,
  logLevelProblem,
  logFormatProblem,
  StoreNotProvisioned,
  prettyLogs,
  packageVersion,
  unsupportedNode,
  type InstanceLock,
  type NatsHandle,
  type NatsServer,
  type ServiceApis,
  NatsServerTooOld,
} from "./platform/index.ts";

const env = process.env;
/** What is running, so a signal at any stage of start-up stops exactly that. */
const lifecycle = {
  stopping: false,
  lock: undefined as InstanceLock | undefined,
  server: undefined as Promise<NatsServer> | undefined,
  connections: [] as NatsHandle[],
  closers: [] as (() => Promise<void>)[],
  /** Flushes and stops the span exporter (set when tracing is on): last, after every span of the shutdown. */
  stopTracing: undefined as (() => Promise<void>) | undefined,
  /** Set once API keys are loaded: what SIGHUP does then (else it stops the process). */
  reloadKeys: undefined as (() => Promise<void>) | undefined,
};

/** The configuration, read before anything starts: a bad value is its one-line fix, and exit. */
const { service: config, placement: placementConfig, microvmHost } = configOrExit(() => readConfig(env));

function configOrExit<T>(read: () => T): T {
  try {
    return read();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    console.error(`error: ${err.message}`);
    process.exit(err.exitCode);
  }
}

/** A start-up failure with its fix, printed as one line. */
class StartupError extends Error {
  override name = "StartupError";
}

/** During start-up: unwind (stop what started), then exit with the message. */
function fail(message: string): never {
  throw new StartupError(message);
}

async function shutdown(reason: string, code = 0): Promise<void> {
  if (lifecycle.stopping) return;
  lifecycle.stopping = true;
  if (code === 0) log.info({ signal: reason }, "shutting down");
  for (const close of lifecycle.closers) await close().catch((err) => log.warn({ err }, "close failed"));
  await lifecycle.stopTracing?.().catch((err) => log.warn({ err }, "flushing the last spans failed"));
  for (const handle of lifecycle.connections) await handle.close().catch(() => undefined);
  const server = await lifecycle.server?.catch(() => undefined);
  await server?.stop();
  await lifecycle.lock?.release().catch(() => undefined);
  process.exit(code);
}

async function privateNatsServer(): Promise<NatsServer> {
  let binary: string;
  try {
    binary = natsServerPath();
  } catch (err) {
    fail(`${(err as Error).message} (or set NATS_URL to join a running NATS)`);
  }
  await mkdir(config.dataDir, { recursive: true });
  // Before touching anything: a live service on this data directory keeps it, and its server.
  lifecycle.lock = await acquireInstanceLock(join(config.dataDir, "service.lock")).catch((err) =>
    err instanceof AlreadyRunning ? fail(err.message) : Promise.reject(err),
  );
  const dir = join(config.dataDir, "nats");
  const pidFile = join(config.dataDir, "nats-server.pid");
  await stopStaleServer(pidFile, dir);
  // No anonymous access: one generated nkey user per role (seeds in DATA_DIR/nats-auth, 0600).
  const credentials = await ensureNatsCredentials(authDirOf(config.dataDir));
  const authorization = authorizationConfig(credentials, config.prefix);
  lifecycle.server = startNatsServer({
    storeDir: dir,
    port: config.natsPort,
    binary,
    sync: config.natsSync,
    authorization,
    dieWithParent: true,
    // Its warnings and errors (a disk full, a refused login) belong in the service's own log.
    onLog: (level, line) => log[level]({ component: "nats-server" }, line),
  });
  const server = await lifecycle.server;
  await writeFile(pidFile, String(server.pid));
  await writeFile(join(config.dataDir, "nats-url"), server.url);
  log.info({ url: server.url, storeDir: dir, binary, sync: config.natsSync }, "started private nats-server");
  return server;
}

/** The API keys, if any; the microVM API beyond loopback refuses to start without them. */
async function apiKeys(active: ReadonlySet<Role>): Promise<ReloadableApiKeys | undefined> {
  if (!active.has("gateway")) return undefined;
  const resolves = await lookup(config.host).then(
    () => true,
    () => false,
  );
  if (!resolves)
    fail(
      `HOST=${config.host} is not an address of this machine (it does not resolve): use 127.0.0.1 (default), ` +
        `0.0.0.0 or ::`,
    );
  if (!config.apiKeysFile && !isLoopback(config.host)) {
    fail(
      `the microVM API listens on ${config.host} and needs API keys: make one with \`npx taskctl apikey create ` +
        `<principal>\`, add its line to a file and set API_KEYS_FILE to it`,
    );
  }
  if (!config.apiKeysFile) {
    log.info({ apiKeys: "off" }, "API keys off: the Task and Job APIs are open, every caller is anonymous");
    return undefined;
  }
  const keys = await loadApiKeys(config.apiKeysFile).catch((err) =>
    fail(`cannot read API_KEYS_FILE: ${(err as Error).message}`),
  );
  log.info(
    { apiKeys: "on", principals: keys.principals, file: config.apiKeysFile },
    `API keys on: ${keys.principals} principal${keys.principals === 1 ? "" : "s"} (SIGHUP reloads the file)`,
  );
  lifecycle.reloadKeys = () => reloadApiKeys(keys);
  return keys;
}

/** SIGHUP with API keys on: reads the key file again; a file that does not parse keeps the old keys. */
async function reloadApiKeys(keys: ReloadableApiKeys): Promise<void> {
  try {
    const revoked = await keys.reload();
    log.info({ apiKeys: "on", principals: keys.principals, revokedKeys: revoked.length }, "API keys reloaded");
  } catch (err) {
    // The message names the file's line, never a hash or a key.
    log.error(
      { apiKeys: "on", principals: keys.principals, reason: (err as Error).message },
      "API keys not reloaded: the old keys stay in use",
    );
  }
}

/** Listens on `port`, or fails with the variable to change. */
async function listenOn(
  server: { listen(port: number, host?: string): Promise<number> },
  port: number,
  variable: string,
): Promise<number> {
  try {
    return await server.listen(port, config.host);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE")
      fail(
        `port ${port} (${variable}) is in use, maybe by another npm start: stop that, or set ${variable} to a free ` +
          `port (0 picks one)`,
      );
    if (code === "EADDRNOTAVAIL")
      fail(`HOST=${config.host} is not an address of this machine: use 127.0.0.1 (default), 0.0.0.0 or ::`);
    if (code === "EACCES") fail(`port ${port} (${variable}) needs privileges: use a port above 1023`);
    throw err;
  }
}

/** Opens (or provisions) the buckets, or fails with what the NATS lacks. */
async function openBucketsOrFail<T>(open: () => Promise<T>, servers: string): Promise<T> {
  try {
    return await open();
  } catch (err) {
    if ((err as Error).name === "JetStreamNotEnabled" || /jetstream is not enabled/i.test((err as Error).message)) {
      fail(
        `the NATS at ${servers} has no JetStream: run it with \`nats-server -js\` (or a jetstream {} block in its ` +
          `config)`,
      );
    }
    if (err instanceof StoreNotProvisioned) fail(err.message);
    throw err;
  }
}

/**
 * Makes the stores of the `active` roles, or brings an earlier release's to the current
 * settings, as the provisioning user; that connection is closed before any role connects (no
 * role's own user may change a stream). Without a provisioning credential (a role's own user on
 * another NATS, as in compose.yaml, whose one-shot `provision` service ran first) the roles
 * open the stores as they are; `--provision` then fails.
 */
async function provisionStores(
  servers: string,
  privateServer: boolean,
  active: ReadonlySet<Role>,
  required: boolean,
): Promise<void> {
  const provisioner = privateServer
    ? { credentials: await readNatsCredentials(authDirOf(config.dataDir), "provision") }
    : await provisionerFromEnv(env);
  if (!provisioner) {
    if (required)
      fail(
        "--provision needs the provisioning credential: NATS_PROVISION_USER and NATS_PROVISION_PASSWORD, " +
          "NATS_PROVISION_CREDS or NATS_PROVISION_NKEY (docs/security.md#provisioning)",
      );
    log.info("no provisioning credential: the stores are opened as they are");
    return;
  }
  const handle = await connectNats({ servers, name: "service:provision", credentials: provisioner.credentials }).catch(
    (err) =>
      fail(
        err instanceof NatsServerTooOld
          ? err.message
          : `cannot connect to NATS at ${servers} to provision the stores: ${(err as Error).message}`,
      ),
  );
  try {
    await openBucketsOrFail(async () => {
      // The gateway reads the actors' buckets: a gateway started alone finds them too.
      if (active.has("actors") || active.has("gateway"))
        await provisionBuckets(handle.nc, { replicas: config.replicas, prefix: config.prefix, only: actorBuckets });
      if (active.has("microvms")) await provisionMicrovmStores(handle.nc, { replicas: config.replicas, ...hostStores });
      // The API keys a gateway's reload removed: gateways write it, microVM hosts read it.
      if (active.has("gateway") || active.has("microvms"))
        await provisionBuckets(handle.nc, { replicas: config.replicas, only: ["keyRevocations"] });
    }, servers).catch((err: Error) =>
      err instanceof StartupError
        ? Promise.reject(err)
        : fail(`cannot provision the stores at ${servers}: ${err.message}`),
    );
  } finally {
    await handle.close().catch(() => undefined);
  }
  log.info({ roles: [...active] }, "stores provisioned");
}

/** The limits of the microVM host's stores, which the provisioning step sets. */
const hostStores = {
  imageStoreMiB: microvmHost.imageStoreMiB,
  snapshots: microvmHost.snapshots,
  snapshotStoreMiB: microvmHost.snapshotStoreMiB,
  logLimits: microvmHost.logLimits,
};

async function main() {
  const flags = configOrExit(() => readFlags(process.argv.slice(2)));
  if (flags.kind !== "run") {
    console.log(flags.kind === "help" ? usage : packageVersion());
    process.exit(0);
  }
  const active = flags.roles;
  if (flags.provisionOnly && !config.natsUrl)
    configOrExit(() => {
      throw new ConfigError(
        "--provision makes the stores on the NATS at NATS_URL: set it (without it, npm start provisions its " +
          "private server itself)",
      );
    });
  const problem = logLevelProblem ?? logFormatProblem;
  if (problem)
    configOrExit(() => {
      throw new ConfigError(problem);
    });
  const oldNode = unsupportedNode();
  if (oldNode) log.warn({ node: process.versions.node }, oldNode);
  const keys = flags.provisionOnly ? undefined : await apiKeys(active);
  // Before any store or route is made: with an OTLP endpoint set, they record spans.
  lifecycle.stopTracing = await startTracing("typed-service");
  const server = config.natsUrl ? undefined : await privateNatsServer();
  const servers = config.natsUrl ?? server!.url;
  await provisionStores(servers, server !== undefined, active, flags.provisionOnly);
  if (flags.provisionOnly) {
    await lifecycle.stopTracing?.();
    process.exit(0);
  }
  // One connection per role, each as its own NATS user: least privilege holds in one process too.
  const connections = lifecycle.connections;
  const connectAs = async (role: Role) => {
    // The private server's own users; NATS_CREDS / NATS_USER / NATS_NKEY are for another NATS.
    const credentials = server
      ? await readNatsCredentials(authDirOf(config.dataDir), role)
      : await credentialsFromEnv(env, role);
    const handle = await connectNats({
      servers,
      name: `service:${role}`,
      credentials,
      // A reconnect to a node older than the minimum (logged by connectNats): stop, exit 1.
      onServerTooOld: () => void shutdown("nats-server too old", 1),
    }).catch((err) =>
      err instanceof NatsServerTooOld
        ? fail(err.message)
        : fail(
            `cannot connect to NATS at ${servers} as ${role}: ` +
              `${(err as Error).message}${config.natsUrl ? " (is NATS_URL right and that server running?)" : ""}`,
          ),
    );
    connections.push(handle);
    return handle;
  };
  const closers = lifecycle.closers;
  const urls: string[] = [];
  let apis: ServiceApis | undefined;
  // What the actors and the microVM host of this process serve here: the gateway beside them hands
  // them requests directly.
  const inProcess = new Map<string, InProcessRoute>();

  if (active.has("actors")) {
    const nats = await connectAs("actors");
    await openBucketsOrFail(() => openBuckets(nats.nc, { only: actorBuckets }), servers);
    // Records of an earlier release get their places in the lists before any list is answered.
    const backfilled = await backfillIndexes(nats.requester);
    if (backfilled > 0) log.info({ indexed: backfilled }, "earlier records indexed for the lists");
    const actors = startActors(nats.nc, recordStores(nats.requester, { replicas: config.replicas }), {
      prefix: config.prefix,
      publisher: nats.publisher,
      requester: nats.requester,
      placement: placementConfig,
      // With API keys, NATS callers are the NATS user, not the anonymous principal (docs/security.md).
      natsPrincipal: config.taskNatsPrincipal ?? (config.apiKeysFile ? NATS_INTERNAL : undefined),
    });
    closers.push(() => actors.close());
    for (const [name, route] of actors.inProcess) inProcess.set(name, route);
    log.info({ prefix: config.prefix }, "actors serving");
  }
  if (active.has("microvms")) {
    const nats = await connectAs("microvms");
    const { microvms } = await openBucketsOrFail(() => openBuckets(nats.nc, { only: ["microvms"] }), servers);
    const { limits, ...hostConfig } = microvmHost;
    const host = await startMicrovmHost(nats.nc, {
      kv: microvms,
      dataDir: config.dataDir,
      prefix: config.prefix,
      replicas: config.replicas,
      limits: withoutUndefined(limits),
      ...withoutUndefined(hostConfig),
    }).catch((err: Error) => {
      // Without a sandbox the rest of the service still runs when the role was not asked for by name.
      if (err instanceof ProviderUnavailable && !flags.explicit) {
        log.error(`microVM host not started: ${err.message}`);
        return undefined;
      }
      return fail(`cannot start the microVM host: ${err.message}`);
    });
    // Closed last: it terminates its instances once the gateway no longer routes requests.
    if (host) closers.push(() => host.close());
    for (const [name, route] of host?.inProcess ?? []) inProcess.set(name, route);
  }
  if (active.has("gateway")) {
    const nats = await connectAs("gateway");
    // Where a reload records the keys it removed, for the microVM hosts.
    if (keys) await openBucketsOrFail(() => openBuckets(nats.nc, { only: ["keyRevocations"] }), servers);
    // With local reads: reads answered from storage here, task objects reached at their owner.
    const dispatch = config.localReads
      ? gatewayDispatch(recordStores(nats.requester, { replicas: config.replicas }))
      : {};
    // Every API answers only Host names it knows (DNS rebinding): the loopback ones, which the
    // gateway adds itself, an address HOST names (not a wildcard) and API_HOSTNAMES.
    const wildcard = config.host === "0.0.0.0" || config.host === "::";
    const hostNames = [...(wildcard ? [] : [config.host]), ...config.hostNames];
    const gateways = createGateways({
      nats,
      ...config,
      ...dispatch,
      apiKeys: keys,
      hostNames,
      inProcess,
    });
    closers.unshift(
      () => gateways.task.close(),
      () => gateways.job.close(),
      () => gateways.microvm.close(),
    );
    const taskPort = await listenOn(gateways.task, config.taskPort, "TASK_API_PORT");
    const jobPort = await listenOn(gateways.job, config.jobPort, "JOB_API_PORT");
    const microvmPort = await listenOn(gateways.microvm, config.microvmPort, "MICROVM_API_PORT");
    const base = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}`;
    urls.push(`${base}:${taskPort}`, `${base}:${jobPort}`, `${base}:${microvmPort}`);
    // For clients on this machine (service.lock): a wildcard address is reached on loopback.
    const local = wildcard ? `http://${config.host === "::" ? "[::1]" : "127.0.0.1"}` : base;
    apis = { task: `${local}:${taskPort}`, job: `${local}:${jobPort}`, microvm: `${local}:${microvmPort}` };
    log.info({ taskPort, jobPort, microvmPort, host: config.host }, "gateway listening");
  } else if (config.metricsPort !== undefined) {
    // Processes without an API still expose /metrics, /livez and /readyz.
    const ops = createServer(opsListener(() => connections.every((c) => c.connected())));
    closers.push(() => new Promise((done) => ops.close(() => done())));
    const metricsPort = await listenOn(
      {
        listen: async (port, host) => (
          ops.listen(port, host), await once(ops, "listening"), (ops.address() as { port: number }).port
        ),
      },
      config.metricsPort,
      "METRICS_PORT",
    );
    urls.push(`http://${config.host}:${metricsPort}`);
    log.info({ metricsPort }, "metrics listening");
  }
  await lifecycle.lock?.setUrls(urls, apis);
  // "ready" means answering: every subscription has reached the server (a request sent after
  // this line finds its responder instead of "no responders").
  await Promise.all(connections.map((handle) => handle.nc.flush()));
  log.info({ nats: servers, roles: [...active] }, "ready");
  if (prettyLogs) printWelcome(urls, servers);
}

/** On a terminal: where to go, and how to stop. */
function printWelcome(urls: string[], servers: string): void {
  const [task, job, microvm] = urls;
  const lines = task
    ? [`Task API     ${task}   (docs: ${task}/docs)`, `Job API      ${job}`, `microVM API  ${microvm}`]
    : urls.map((u) => `metrics      ${u}/metrics`);
  console.log(["", ...lines, `NATS         ${servers}`, "", "Ctrl-C to stop", ""].join("\n"));
}

// First thing once the modules are loaded: a signal at any stage of start-up stops what started.
for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => void shutdown(signal));
// SIGHUP reloads the API keys when they are on (requests in flight go on); otherwise it stops.
process.on(
  "SIGHUP",
  () => void (lifecycle.reloadKeys && !lifecycle.stopping ? lifecycle.reloadKeys() : shutdown("SIGHUP")),
);

function withoutUndefined<T extends object>(value: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as never;
}

main().catch((err: Error) => {
  if (lifecycle.stopping) return; // a signal stopped the start-up: its shutdown exits
  if (err instanceof StartupError) console.error(`error: ${err.message}`);
  else log.fatal({ err }, "failed to start");
  void shutdown("start-up failed", 1);
});

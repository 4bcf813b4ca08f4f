// The system under test, each part its own process: a private `nats-server -js` on a temp
// store with the generated per-role users (as `npm start` runs it; NATS_SYNC as the caller's,
// else 1s), the service (`main.ts`, one process or gateway + actors apart) on free ports it
// reports, the bare node:http baseline, the same service on an anonymous nats-server (auth off,
// for the `:noauth` rows) and, for the `:always` workloads, a second authenticated nats-server
// with NATS_SYNC=always and its own one-process service; for the `:r3` workloads, two 3-node
// clusters (R3 buckets), one per NATS_SYNC (`1s`, `always`), each with its own one-process
// service. With `natsBinary`, every nats-server of it runs that binary (`--nats-compare`).
// `close()` stops them all and removes the stores.
import { mkdtemp, rm } from "node:fs/promises";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  authDirOf,
  authorizationConfig,
  connectNats,
  ensureNatsCredentials,
  parseNatsSync,
  type NatsCredentials,
  type NatsHandle,
  type NatsRole,
} from "../platform/index.ts";
import type { GatewayPorts, RoleSet } from "../cluster/index.ts";
import {
  exitedChildren,
  killAllSync,
  startBuiltServer,
  startBuiltService,
  startNats,
  startNatsR3,
  runningPids,
  stopAll,
  type Child,
} from "./children.ts";
import type { ProcessGroups } from "./types.ts";

/** Whose RSS and CPU count as "service" (and "nats") for a row. */
export type ServiceGroup = "service" | "bare" | "always" | "noAuth" | "r3" | "r3Always";

export interface EnvironmentOptions {
  /** Run the gateway and the actors as two processes instead of one. */
  splitRoles: boolean;
  /** Directory for `node --cpu-prof` profiles of the service process(es). */
  cpuProfDir?: string;
  /** Extra node flags for the service processes. */
  nodeFlags?: string[];
  /** Also start the NATS_SYNC=always stack (nats-server + service). */
  syncAlways: boolean;
  /** Also start the R3 stacks (a 3-node cluster + service, for NATS_SYNC 1s and always). */
  r3: boolean;
  /** Another nats-server binary for every server of this environment (default: `natsServerPath()`). */
  natsBinary?: string;
}

/** The NATS_SYNC=always stack's API URLs. */
export interface AlwaysStack {
  taskUrl: string;
  jobUrl: string;
}

export interface Environment {
  natsUrl: string;
  /** nats-server's temporary store (removed by `close()`). */
  storeDir: string;
  taskUrl: string;
  jobUrl: string;
  bareUrl: string;
  /** The NATS_SYNC=always stack, when started. */
  always?: AlwaysStack;
  /** The R3 stacks by NATS_SYNC, when started. */
  r3?: { "1s": AlwaysStack; always: AlwaysStack };
  /** The Task API of the same service with NATS auth off (its own anonymous nats-server). */
  noAuthTaskUrl: string;
  /** The bench's own connection (noAsyncTraces on) for direct NATS load and seeding. */
  nc: NatsConnection;
  /** Pids of `service` (main.ts processes), `nats`, `bare`, the always stack's and the auth-off service's. */
  pids: {
    service: number[];
    nats: number[];
    bare: number[];
    alwaysService: number[];
    alwaysNats: number[];
    noAuth: number[];
    noAuthNats: number[];
    r3: number[];
    r3Nats: number[];
    r3Always: number[];
    r3AlwaysNats: number[];
  };
  groups(serviceGroup: ServiceGroup): ProcessGroups;
  /** Which of the system's processes have died (a crash mid-run explains a failing row). */
  deaths(): string[];
  close(): Promise<void>;
}

/**
 * The one-process service: the Task and Job APIs and their actors. No workload here uses the
 * microVM host (`--microvm` measures it), so its start-up and idle timers stay out of the figures.
 */
const ONE_PROCESS: RoleSet = ["gateway", "actors"];

/** Service settings a caller's shell might carry; the benchmarks set their own. */
const serviceEnvKeys = [
  "NATS_URL",
  "DATA_DIR",
  "NATS_PORT",
  "HOST",
  "TASK_API_PORT",
  "JOB_API_PORT",
  "MICROVM_API_PORT",
  "METRICS_PORT",
  "NATS_SUBJECT_PREFIX",
  "BODY_LIMIT_BYTES",
  "REQUEST_TIMEOUT_MS",
  "KV_REPLICAS",
  "LOG_LEVEL",
  "NODE_OPTIONS",
  "GATEWAY_LOCAL_READS",
  "READ_CACHE_ENTRIES",
  // NATS credentials: the benchmark hands the service its own generated users (or none).
  "NATS_AUTH_DIR",
  "NATS_CREDS",
  "NATS_USER",
  "NATS_PASSWORD",
  "NATS_NKEY",
  "NATS_INBOX_PREFIX",
  // The microVM host's settings (the microVM bench sets those it measures).
  "MICROVM_HOST_ID",
  "MICROVM_TOKEN_SECRET",
  "MICROVM_MAX_INSTANCES",
  "MICROVM_QUOTA_PER_PRINCIPAL",
  "MICROVM_RETENTION_SECONDS",
  "MICROVM_PROXY_HOST",
  "MICROVM_PROXY_BIND",
  "MICROVM_PROVIDER",
  "MICROVM_MEMORY_MIB",
  "MICROVM_CPUS",
  "MICROVM_TOTAL_CPUS",
  "MICROVM_PIDS",
  "MICROVM_SCRATCH_MIB",
];

/** The caller's environment without the service settings in it. */
export function callerEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of serviceEnvKeys) delete env[key];
  return env;
}

export async function startEnvironment(options: EnvironmentOptions): Promise<Environment> {
  const storeDir = await mkdtemp(join(tmpdir(), "bench-nats-"));
  const binary = options.natsBinary;
  // An environment started before this one (the `--nats-compare` one after the main) keeps its processes.
  const earlier = runningPids();
  const removeStore = () => rm(storeDir, { recursive: true, force: true });
  process.once("exit", () => rmSync(storeDir, { recursive: true, force: true }));
  let handle: NatsHandle | undefined;
  const close = async () => {
    await handle?.close().catch(() => {});
    await stopAll(5_000, earlier);
    await removeStore();
  };
  try {
    const authDir = authDirOf(storeDir);
    const credentials = await ensureNatsCredentials(authDir);
    const authorization = authorizationConfig(credentials);
    const nats = await startNats(join(storeDir, "sync-main"), { sync: mainSync(), authorization, binary });
    const nodeFlags = [
      ...(options.nodeFlags ?? []),
      ...(options.cpuProfDir ? ["--cpu-prof", `--cpu-prof-dir=${options.cpuProfDir}`] : []),
    ];
    const roleSets: RoleSet[] = options.splitRoles ? ["actors", "gateway"] : [ONE_PROCESS];
    const main = await startService(
      "service",
      nats.server.url,
      join(storeDir, "service-data"),
      roleSets,
      nodeFlags,
      authDir,
    );
    // Same generated users as the main stack (both servers name the same public keys).
    const alwaysNats = options.syncAlways
      ? await startNats(join(storeDir, "sync-always"), { sync: "always", authorization, binary })
      : undefined;
    const always =
      alwaysNats &&
      (await startService(
        "service (sync always)",
        alwaysNats.server.url,
        join(storeDir, "always-data"),
        [ONE_PROCESS],
        nodeFlags,
        authDir,
      ));
    const r3 = options.r3
      ? await startR3Stacks(storeDir, { authorization, credentials, authDir, nodeFlags, binary })
      : undefined;
    const { child: bare, port: barePort } = await startBuiltServer("bare", "bench/bare-server.ts", callerEnv());
    const bareUrl = `http://127.0.0.1:${barePort}`;
    // The same service with NATS auth off, for the auth cost in the same run.
    const openNats = await startNats(join(storeDir, "nats-noauth"), { sync: mainSync(), binary });
    const open = await startService(
      "service noauth",
      openNats.server.url,
      join(storeDir, "service-noauth-data"),
      [ONE_PROCESS],
      nodeFlags,
    );
    // Direct NATS load runs as another service would: the `internal` user.
    handle = await connectNats({ servers: nats.server.url, name: "bench", credentials: credentials.internal });
    const pids = {
      service: main.children.map((s) => s.pid),
      nats: [nats.child.pid],
      bare: [bare.pid],
      alwaysService: always?.children.map((s) => s.pid) ?? [],
      alwaysNats: alwaysNats ? [alwaysNats.child.pid] : [],
      noAuth: open.children.map((s) => s.pid),
      noAuthNats: [openNats.child.pid],
      r3: r3?.["1s"].service.map((c) => c.pid) ?? [],
      r3Nats: r3?.["1s"].nats.map((c) => c.pid) ?? [],
      r3Always: r3?.always.service.map((c) => c.pid) ?? [],
      r3AlwaysNats: r3?.always.nats.map((c) => c.pid) ?? [],
    };
    const children = [
      nats.child,
      ...main.children,
      bare,
      ...(alwaysNats ? [alwaysNats.child] : []),
      ...(always?.children ?? []),
      openNats.child,
      ...open.children,
      ...(r3 ? [...r3["1s"].nats, ...r3["1s"].service, ...r3.always.nats, ...r3.always.service] : []),
    ];
    return {
      natsUrl: nats.server.url,
      storeDir,
      taskUrl: main.taskUrl,
      jobUrl: main.jobUrl,
      bareUrl,
      always: always && { taskUrl: always.taskUrl, jobUrl: always.jobUrl },
      r3: r3 && { "1s": r3["1s"].urls, always: r3.always.urls },
      noAuthTaskUrl: open.taskUrl,
      nc: handle.nc,
      pids,
      groups: (serviceGroup) =>
        serviceGroup === "always"
          ? { service: pids.alwaysService, nats: pids.alwaysNats }
          : serviceGroup === "noAuth"
            ? { service: pids.noAuth, nats: pids.noAuthNats }
            : serviceGroup === "r3" || serviceGroup === "r3Always"
              ? { service: pids[serviceGroup], nats: pids[`${serviceGroup}Nats`] }
              : { service: pids[serviceGroup], nats: pids.nats },
      deaths: () => exitedChildren(children),
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

/** Two R3 stacks: a 3-node cluster with NATS_SYNC `1s`, one with `always`, each with its service. */
async function startR3Stacks(
  storeDir: string,
  options: {
    authorization: string;
    credentials: Record<NatsRole, NatsCredentials>;
    authDir: string;
    nodeFlags: string[];
    binary?: string;
  },
) {
  const stack = async (sync: "1s" | "always") => {
    const nats = await startNatsR3(join(storeDir, `r3-${sync}`), {
      sync,
      authorization: options.authorization,
      credentials: options.credentials,
      binary: options.binary,
    });
    const service = await startService(
      `service (R3, ${sync})`,
      nats.url,
      join(storeDir, `r3-${sync}-data`),
      [ONE_PROCESS],
      options.nodeFlags,
      options.authDir,
      { KV_REPLICAS: "3" },
    );
    return {
      nats: nats.children,
      service: service.children,
      urls: { taskUrl: service.taskUrl, jobUrl: service.jobUrl },
    };
  };
  return { "1s": await stack("1s"), always: await stack("always") };
}

/** NATS_SYNC of the main stack: the caller's NATS_SYNC (to compare another interval), else 1s. */
export function mainSync(): string {
  return parseNatsSync(process.env.NATS_SYNC);
}

/**
 * The service (`main.ts`) on NATS `natsUrl`, one process per role set (the gateway last), each
 * ready once it logs "ready"; `authDir`: the generated role seeds (NATS_AUTH_DIR), none for an
 * anonymous server.
 */
async function startService(
  name: string,
  natsUrl: string,
  dataDir: string,
  roleSets: RoleSet[],
  nodeFlags: string[],
  authDir?: string,
  extraEnv: Record<string, string> = {},
) {
  // Its own data dir and free ports: never collides with an `npm start` or another bench.
  const env = {
    ...(authDir ? { NATS_AUTH_DIR: authDir } : {}),
    TASK_API_PORT: "0",
    JOB_API_PORT: "0",
    MICROVM_API_PORT: "0",
    ...extraEnv,
  };
  const children: Child[] = [];
  let ports: GatewayPorts | undefined;
  for (const role of roleSets) {
    const processName = `${name}${roleSets.length > 1 ? ` ${role}` : ""}`;
    const started = await startBuiltService({
      name: processName,
      role,
      natsUrl,
      dataDir,
      runDir: dirname(dataDir),
      env,
      baseEnv: callerEnv(),
      nodeFlags,
    });
    children.push(started.child);
    ports ??= started.ports;
  }
  if (!ports) throw new Error(`${name}: no process of ${roleSets.join(" ")} runs the gateway`);
  const [taskUrl, jobUrl] = [ports.task, ports.job].map((port) => `http://127.0.0.1:${port}`);
  return { children, taskUrl, jobUrl };
}

/** Stops every child on Ctrl-C or SIGTERM (twice: at once), and SIGKILLs leftovers on exit. */
export function installShutdownHandlers(onInterrupt: () => Promise<void>): void {
  let interrupted = false;
  const handler = (signal: NodeJS.Signals) => {
    if (interrupted) {
      killAllSync();
      process.exit(130);
    }
    interrupted = true;
    console.error(`\n${signal}: stopping the benchmark's processes…`);
    void onInterrupt().finally(() => process.exit(130));
  };
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
  process.on("exit", killAllSync);
}

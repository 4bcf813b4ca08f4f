// The processes a bench measures, started and tracked (children.ts): a private nats-server, a
// 3-node R3 cluster, the service from its bundle (one process per role set, on free ports, in
// the caller's environment minus the service's settings), the bench's own bare servers.
// Starting one and waiting until it is ready is cluster/'s and platform/'s.
import { basename, dirname, join } from "node:path";
import { build } from "esbuild";
import {
  startNatsCluster,
  startNodeProcess,
  startRole,
  waitForJetStream,
  type GatewayPorts,
  type NatsNode,
  type RoleSet,
} from "../cluster/index.ts";
import { startNatsServer, type NatsCredentials, type NatsRole, type NatsServer } from "../platform/index.ts";
import { root, track, whileStarting, type Child } from "./children.ts";

/**
 * A private nats-server. `sync`: JetStream's NATS_SYNC (`1s` or `always`); `authorization`:
 * the generated per-role users (`authorizationConfig`; none: anonymous); `binary`: another
 * nats-server than the one `natsServerPath()` finds (no version check: `--nats-compare`).
 */
export async function startNats(
  storeDir: string,
  options: { sync?: string; authorization?: string; binary?: string } = {},
): Promise<{ server: NatsServer; child: Child }> {
  const server = await startNatsServer({
    storeDir,
    sync: options.sync ?? "1s",
    authorization: options.authorization,
    binary: options.binary,
  });
  return { server, child: track({ name: "nats-server", pid: server.pid, process: server.process, stop: server.stop }) };
}

/**
 * A 3-node loopback JetStream cluster (R3 buckets created) with JetStream's `sync` on every
 * node; its nodes are tracked like the other children (stopped by `stopAll`, killed on exit).
 */
export async function startNatsR3(
  baseDir: string,
  options: {
    sync: string;
    authorization: string;
    credentials: Record<NatsRole, NatsCredentials>;
    binary?: string;
  },
): Promise<{ url: string; children: Child[] }> {
  const cluster = await startNatsCluster({
    baseDir,
    names: ["r3-1", "r3-2", "r3-3"],
    clusterName: "bench-r3",
    sync: options.sync,
    authorization: options.authorization,
    binary: options.binary,
  });
  const trackNode = (node: NatsNode) =>
    track({
      name: `nats-server ${node.name} (R3, ${options.sync})`,
      pid: node.server!.pid,
      process: node.server!.process,
      stop: node.server!.stop,
    });
  const children = cluster.nodes.map(trackNode);
  await waitForJetStream(cluster.url, { replicas: 3, credentials: options.credentials });
  return { url: cluster.url, children };
}

/**
 * Bundles `entry` of the checkout at `from` (default: this one) with esbuild (dependencies stay
 * in that checkout's node_modules) so that it runs on plain `node`, as `npm start` runs the
 * service: no TypeScript loader in the measured process.
 */
async function bundle(entry: string, from = root): Promise<string> {
  const outfile = join(from, "dist", `${basename(entry, ".ts")}.mjs`);
  await build({
    entryPoints: [join(from, entry)],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    packages: "external",
    outfile,
    logLevel: "warning",
  });
  return outfile;
}

/** A service's warning or error (pino level 40 and up), or anything it writes that is not a log entry. */
export function isProblem(line: string): boolean {
  if (line.trim() === "") return false;
  try {
    const { level } = JSON.parse(line) as { level?: unknown };
    return typeof level !== "number" || level >= 40;
  } catch {
    return true;
  }
}

/** Problems on the bench's stderr: a run that fails says why (e.g. a provider that cannot start here). */
function echoProblems(name: string, line: string): void {
  if (isProblem(line)) console.error(`${name}: ${line}`);
}

/** One of the bench's own servers (`bench/<name>.ts`) from its bundle, on the port it reports when ready. */
export async function startBuiltServer(
  name: string,
  entry: string,
  env: NodeJS.ProcessEnv,
): Promise<{ child: Child; port: number }> {
  const args = [await bundle(entry)];
  const proc = await whileStarting((onSpawn) => startNodeProcess({ name, args, env, cwd: root, onSpawn }));
  const port = Number(proc.startup.at(-1)?.port);
  return { child: track({ name, pid: proc.pid, process: proc.child, stop: proc.stop }), port };
}

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

export interface ServiceOptions {
  /** The process's name in logs and warnings (one role set of several: its roles appended). */
  name: string;
  natsUrl: string;
  dataDir: string;
  /** Recorded in the process environment (cluster/'s `stopLeftovers`); default: `dataDir`'s parent. */
  runDir?: string;
  /** One process per role set, the gateway's last. */
  roleSets: readonly RoleSet[];
  nodeFlags?: readonly string[];
  /** The generated role seeds (NATS_AUTH_DIR); none for an anonymous nats-server. */
  authDir?: string;
  /** Service settings on top of free ports. */
  env?: Record<string, string>;
  /** The checkout whose `main.ts` runs (default: this one; `--service-compare`). */
  checkout?: string;
}

/** `node --cpu-prof` into `dir`, when given. */
export const profileFlags = (dir: string | undefined): string[] => (dir ? ["--cpu-prof", `--cpu-prof-dir=${dir}`] : []);

/**
 * The service (`main.ts --role …`) from its bundle, each process ready once it logs "ready", on
 * free ports it reports. In the bench's own session, as every process measured: a session apart
 * would get a CPU share of its own from the scheduler (autogroup) and skew the figures.
 */
export async function startService(options: ServiceOptions) {
  const { name, roleSets } = options;
  // Its own data dir and free ports: never collides with an `npm start` or another bench.
  const env = {
    ...(options.authDir ? { NATS_AUTH_DIR: options.authDir } : {}),
    TASK_API_PORT: "0",
    JOB_API_PORT: "0",
    MICROVM_API_PORT: "0",
    ...options.env,
  };
  const entry = [...(options.nodeFlags ?? []), await bundle("main.ts", options.checkout)];
  const children: Child[] = [];
  let ports: GatewayPorts | undefined;
  for (const role of roleSets) {
    const proc = await whileStarting((onSpawn) =>
      startRole({
        name: `${name}${roleSets.length > 1 ? ` ${role}` : ""}`,
        role,
        natsUrl: options.natsUrl,
        dataDir: options.dataDir,
        runDir: options.runDir ?? dirname(options.dataDir),
        env,
        baseEnv: callerEnv(),
        entry,
        cwd: options.checkout,
        detached: false,
        onSpawn,
        onLine: echoProblems,
      }),
    );
    children.push(track({ name: proc.name, pid: proc.pid, process: proc.child, stop: proc.stop }));
    ports ??= proc.ports;
  }
  if (!ports) throw new Error(`${name}: no process of ${roleSets.join(" ")} runs the gateway`);
  const [taskUrl, jobUrl] = [ports.task, ports.job].map((port) => `http://127.0.0.1:${port}`);
  return { children, ports, taskUrl, jobUrl };
}

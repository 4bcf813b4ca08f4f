// Every process the benchmark starts, tracked by pid so each one is stopped at the end, on
// error and on Ctrl-C: the private nats-servers and R3 clusters, the service, the bare servers.
// Starting one and waiting until it is ready is cluster/'s and platform/'s; this file bundles
// the bench's entries and keeps the list.
import type { ChildProcess } from "node:child_process";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import {
  startNatsCluster,
  startNodeProcess,
  startRole,
  waitForJetStream,
  type GatewayPorts,
  type NatsNode,
  type RoleProcessOptions,
} from "../cluster/index.ts";
import { startNatsServer, type NatsCredentials, type NatsRole, type NatsServer } from "../platform/index.ts";

export const root = fileURLToPath(new URL("..", import.meta.url));

export interface Child {
  readonly name: string;
  readonly pid: number;
  readonly process: ChildProcess;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process has exited. */
  stop(graceMs?: number): Promise<void>;
}

const running = new Map<number, Child>();
/** Spawned and not yet ready (or failed): only a SIGKILL on exit can reach them. */
const starting = new Set<number>();

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function track(child: Child): Child {
  running.set(child.pid, child);
  child.process.once("exit", () => running.delete(child.pid));
  return child;
}

/** Runs `start` with `starting` holding the pid it spawns until `start` settles. */
async function whileStarting<T>(start: (onSpawn: (pid: number) => void) => Promise<T>): Promise<T> {
  let spawned: number | undefined;
  try {
    return await start((pid) => starting.add((spawned = pid)));
  } finally {
    if (spawned !== undefined) starting.delete(spawned);
  }
}

/** The pids of the children running now (to stop only those started after, with `stopAll`). */
export function runningPids(): ReadonlySet<number> {
  return new Set(running.keys());
}

/** Stops every child still running but those in `spared`, the services before nats-server. */
export async function stopAll(graceMs = 5_000, spared: ReadonlySet<number> = new Set()): Promise<void> {
  const isNats = (child: Child) => Number(child.name.startsWith("nats-server"));
  const order = [...running.values()].filter((c) => !spared.has(c.pid)).sort((a, b) => isNats(a) - isNats(b));
  for (const child of order) await child.stop(graceMs);
}

/** Children that were started and have exited since, with how they ended. */
export function exitedChildren(children: Child[]): string[] {
  return children
    .filter((child) => exited(child.process))
    .map(
      (child) => `${child.name} (pid ${child.pid}) exited with ${child.process.exitCode ?? child.process.signalCode}`,
    );
}

/** Last resort on process exit: SIGKILL whatever is still running or starting. */
export function killAllSync(): void {
  for (const child of running.values()) {
    if (!exited(child.process)) child.process.kill("SIGKILL");
  }
  for (const pid of starting) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* already gone */
    }
  }
}

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
 * Bundles `entry` with esbuild (dependencies stay in node_modules) so that it runs on plain
 * `node`, as `npm start` runs the service: no TypeScript loader in the measured process.
 */
async function bundle(entry: string): Promise<string> {
  const outfile = join(root, "dist", `${basename(entry, ".ts")}.mjs`);
  await build({
    entryPoints: [join(root, entry)],
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

export type ServiceOptions = Omit<RoleProcessOptions, "entry" | "onSpawn"> & { readonly nodeFlags?: readonly string[] };

/**
 * The service (`main.ts --role …`) from its bundle, ready once it logs "ready"; `ports`: its
 * gateway's, if it has one. In the bench's own session, as every process measured: a session
 * apart would get a CPU share of its own from the scheduler (autogroup) and skew the figures.
 */
export async function startBuiltService(options: ServiceOptions): Promise<{ child: Child; ports?: GatewayPorts }> {
  const entry = [...(options.nodeFlags ?? []), await bundle("main.ts")];
  const proc = await whileStarting((onSpawn) =>
    startRole({ ...options, entry, detached: false, onSpawn, onLine: echoProblems }),
  );
  return { child: track({ name: proc.name, pid: proc.pid, process: proc.child, stop: proc.stop }), ports: proc.ports };
}

/**
 * The service's warnings and errors (pino levels 40 and up) and anything it writes that is not
 * a log entry, on the bench's stderr: a run that fails says why (e.g. a provider that cannot
 * start here), where only the service's log had it.
 */
function echoProblems(name: string, line: string): void {
  let level: unknown;
  try {
    level = (JSON.parse(line) as { level?: unknown }).level;
  } catch {
    level = undefined;
  }
  if (typeof level !== "number" || level >= 40) console.error(`${name}: ${line}`);
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

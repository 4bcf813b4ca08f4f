// `npm run cluster`: the compose.yaml topology as local processes (three nats-server nodes with
// routes on loopback, two gateways, two actor processes, a microVM host, R3 buckets). Prints
// the URLs; Ctrl-C or SIGTERM stops every process it started, by pid.
import { execFileSync } from "node:child_process";
import { chmod, mkdir, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { natsServerPath, packageVersion, parseNatsSync } from "../platform/index.ts";
import {
  recordPids,
  startCluster,
  stopLeftovers,
  topologyFromEnv,
  writeComposeAuthorization,
  type RunningCluster,
} from "./index.ts";

const usage = `usage: npm run cluster [-- --fresh] [-- --quiet] [-- --version]

Starts three nats-server nodes (JetStream cluster), two gateways, two actor processes and a
microVM host on this machine, with KV_REPLICAS=3.

  --fresh   delete the cluster's data (CLUSTER_DIR, default .data/cluster) first
  --quiet   print only warnings and errors of the services

env: CLUSTER_DIR, CLUSTER_NATS_PORTS (default 14222,14223,14224), CLUSTER_ROUTE_PORTS
(16222,16223,16224), CLUSTER_GATEWAY_PORTS (base port per gateway: 8787,9787; each serves the
Task, Job and microVM APIs on base, base+1, base+2), LOG_LEVEL, NATS_SYNC (JetStream sync_interval of every node: 1s or always), NATS_SERVER_BIN.`;

const flags = (() => {
  try {
    return parseArgs({
      options: {
        fresh: { type: "boolean" },
        quiet: { type: "boolean", short: "q" },
        help: { type: "boolean", short: "h" },
        version: { type: "boolean", short: "v" },
      },
    }).values;
  } catch (err) {
    console.error(`error: ${(err as Error).message} (npm run cluster -- --help)`);
    process.exit(2);
  }
})();
if (flags.help) {
  console.log(usage);
  process.exit(0);
}
if (flags.version) {
  console.log(packageVersion());
  process.exit(0);
}

const baseDir = resolve(process.env.CLUSTER_DIR || ".data/cluster");
const topology = (() => {
  try {
    return topologyFromEnv(process.env);
  } catch (err) {
    console.error(`error: ${(err as Error).message}`);
    process.exit(2);
  }
})();
/** Checked before anything starts: a current nats-server, a valid NATS_SYNC. */
const natsBinary = (() => {
  try {
    parseNatsSync(process.env.NATS_SYNC);
    return natsServerPath();
  } catch (err) {
    console.error(`error: ${(err as Error).message}`);
    process.exit(2);
  }
})();

const levels: Record<number, string> = { 10: "TRACE", 20: "DEBUG", 30: "INFO ", 40: "WARN ", 50: "ERROR", 60: "FATAL" };

/** One service log line, compact: `name LEVEL msg {fields}`. */
function printLine(name: string, line: string): void {
  let entry: Record<string, unknown> | undefined;
  try {
    entry = line.startsWith("{") ? (JSON.parse(line) as Record<string, unknown>) : undefined;
  } catch {
    entry = undefined;
  }
  if (!entry) return void (flags.quiet || console.log(`${name.padEnd(15)} ${line}`));
  const { level, time: _time, pid: _pid, hostname: _host, msg, ...fields } = entry;
  if (flags.quiet && Number(level) < 40) return;
  const rest = Object.keys(fields).length > 0 ? ` ${JSON.stringify(fields)}` : "";
  console.log(`${name.padEnd(15)} ${levels[Number(level)] ?? level} ${msg}${rest}`);
}

/**
 * A launcher that runs nats-server in a session of its own, so a Ctrl-C in the terminal reaches
 * this runner only and the nodes stop after the services (which need NATS to shut down cleanly).
 */
async function detachedNatsBinary(): Promise<string> {
  try {
    execFileSync("sh", ["-c", "command -v setsid"], { stdio: "ignore" });
  } catch {
    return natsBinary;
  }
  const path = join(baseDir, "nats-server.sh");
  await writeFile(path, `#!/bin/sh\nexec setsid ${JSON.stringify(natsBinary)} "$@"\n`);
  await chmod(path, 0o755);
  return path;
}

const left = await stopLeftovers(baseDir);
if (left.length > 0) console.log(`stopped ${left.length} process(es) left by an earlier run in ${baseDir}`);
if (flags.fresh) await rm(baseDir, { recursive: true, force: true });
await mkdir(baseDir, { recursive: true });
// The users of compose.yaml's nodes, from the contracts as they are now (not kept in the repository).
await writeComposeAuthorization();

const pids: number[] = [];
let cluster: RunningCluster | undefined;
let stopping = false;

async function shutdown(signal: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  console.log(`\n${signal}: stopping the cluster`);
  if (cluster) await cluster.stop();
  else await killAll(pids); // interrupted while starting
  await recordPids(baseDir, []);
  console.log("stopped");
  process.exit(0);
}
process.on("SIGINT", () => void shutdown("SIGINT"));
process.on("SIGTERM", () => void shutdown("SIGTERM"));

async function killAll(list: readonly number[]): Promise<void> {
  const send = (pid: number, sig: NodeJS.Signals | 0) => {
    try {
      process.kill(pid, sig);
      return true;
    } catch {
      return false;
    }
  };
  for (const pid of list) send(pid, "SIGTERM");
  for (let i = 0; i < 50 && list.some((pid) => send(pid, 0)); i++) await new Promise((r) => setTimeout(r, 100));
  for (const pid of list) send(pid, "SIGKILL");
}

const started = Date.now();
console.log(
  `starting ${topology.nats.length} NATS nodes, ${topology.gateways.length} gateways, ${topology.actors.length} ` +
    `actor processes, ${topology.microvmHosts.length} microVM host(s) in ${baseDir}`,
);
try {
  cluster = await startCluster(topology, {
    baseDir,
    natsBinary: await detachedNatsBinary(),
    onLine: printLine,
    onStarted: (pid) => {
      pids.push(pid);
      void recordPids(baseDir, pids);
    },
  });
} catch (err) {
  if (stopping) await new Promise(() => {}); // interrupted while starting: shutdown() exits
  console.error(`error: the cluster did not start: ${(err as Error).message}`);
  await killAll(pids);
  await recordPids(baseDir, []);
  process.exit(1);
}
if (stopping) await new Promise(() => {}); // a signal arrived while starting: shutdown() exits

for (const node of cluster.nats.nodes) {
  node.server?.process.once("exit", (code, sig) => stopping || console.error(`${node.name} exited (${code ?? sig})`));
}
for (const service of cluster.services) {
  service.child.once("exit", (code, sig) => stopping || console.error(`${service.name} exited (${code ?? sig})`));
}
await writeFile(join(baseDir, "nats-url"), cluster.nats.url);

const url = (port: number) => `http://127.0.0.1:${port}`;
const lines = [
  "",
  `cluster ready in ${((Date.now() - started) / 1000).toFixed(1)} s (JetStream meta leader after ` +
    `${(cluster.jetStreamReadyMs / 1000).toFixed(1)} s)`,
  `  NATS_URL=${cluster.nats.url}`,
  ...cluster.gateways.map(
    (g) =>
      `  ${g.name.padEnd(15)} Task API ${url(g.ports!.task)}  Job API ${url(g.ports!.job)}  microVM API ` +
      `${url(g.ports!.microvm)}`,
  ),
  `  ${cluster.services
    .filter((s) => s.role !== "gateway")
    .map((s) => `${s.name} (pid ${s.pid})`)
    .join(", ")}`,
  `  try: npm run -s cli -- tasks create "hello" --url ${url(cluster.gateways.at(-1)!.ports!.task)}`,
  "Ctrl-C stops everything.",
  "",
];
console.log(lines.join("\n"));

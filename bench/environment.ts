// The system under test, each part its own process: a private `nats-server -js` on a temp
// store, the service (`main.ts`, one process or gateway + actors apart) on explicit free
// ports, and the bare node:http baseline. `close()` stops them all and removes the store.
import { mkdtemp, rm } from "node:fs/promises";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, freePort, type NatsHandle } from "../platform/index.ts";
import { exitedChildren, killAllSync, spawnBuilt, startNats, stopAll, waitForHttp, type Child } from "./children.ts";
import type { ProcessGroups } from "./types.ts";

export interface EnvironmentOptions {
  /** Run the gateway and the actors as two processes instead of one. */
  splitRoles: boolean;
  /** Directory for `node --cpu-prof` profiles of the service process(es). */
  cpuProfDir?: string;
}

export interface Environment {
  natsUrl: string;
  /** nats-server's temporary store (removed by `close()`). */
  storeDir: string;
  taskUrl: string;
  jobUrl: string;
  bareUrl: string;
  /** The bench's own connection (noAsyncTraces on) for direct NATS load and seeding. */
  nc: NatsConnection;
  /** Pids of `service` (main.ts processes), `nats` and `bare`. */
  pids: { service: number[]; nats: number[]; bare: number[] };
  groups(serviceGroup: "service" | "bare"): ProcessGroups;
  /** Which of the system's processes have died (a crash mid-run explains a failing row). */
  deaths(): string[];
  close(): Promise<void>;
}

/** Service settings a caller's shell might carry; the benchmark sets its own. */
const serviceEnvKeys = [
  "NATS_URL", "DATA_DIR", "NATS_PORT", "HOST", "TASK_API_PORT", "JOB_API_PORT", "NATS_SUBJECT_PREFIX",
  "BODY_LIMIT_BYTES", "REQUEST_TIMEOUT_MS", "KV_REPLICAS", "LOG_LEVEL", "NODE_OPTIONS",
];

function serviceEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of serviceEnvKeys) delete env[key];
  return { ...env, LOG_LEVEL: "warn", ...extra };
}

export async function startEnvironment(options: EnvironmentOptions): Promise<Environment> {
  const storeDir = await mkdtemp(join(tmpdir(), "bench-nats-"));
  const removeStore = () => rm(storeDir, { recursive: true, force: true });
  process.once("exit", () => rmSync(storeDir, { recursive: true, force: true }));
  let handle: NatsHandle | undefined;
  const close = async () => {
    await handle?.close().catch(() => {});
    await stopAll();
    await removeStore();
  };
  try {
    const nats = await startNats(storeDir);
    const [taskPort, jobPort, microvmPort, barePort] = [await freePort(), await freePort(), await freePort(), await freePort()];
    // Its own data dir and ports: never collides with an `npm start` or another bench.
    const env = serviceEnv({
      NATS_URL: nats.server.url,
      TASK_API_PORT: String(taskPort),
      JOB_API_PORT: String(jobPort),
      MICROVM_API_PORT: String(microvmPort),
      DATA_DIR: join(storeDir, "service-data"),
    });
    const nodeFlags = options.cpuProfDir ? ["--cpu-prof", `--cpu-prof-dir=${options.cpuProfDir}`] : [];
    const roleSets = options.splitRoles ? [["--role", "actors"], ["--role", "gateway"]] : [[]];
    const services: Child[] = [];
    for (const args of roleSets) services.push(await spawnBuilt(`service${args.length ? ` ${args[1]}` : ""}`, "main.ts", args, env, nodeFlags));
    const bare = await spawnBuilt("bare", "bench/bare-server.ts", [], serviceEnv({ BENCH_PORT: String(barePort) }));
    const [taskUrl, jobUrl, bareUrl] = [taskPort, jobPort, barePort].map((port) => `http://127.0.0.1:${port}`);
    const gateway: Child = services[services.length - 1]!;
    await Promise.all([waitForHttp(taskUrl, gateway), waitForHttp(jobUrl, gateway), waitForHttp(bareUrl, bare)]);
    handle = await connectNats({ servers: nats.server.url, name: "bench" });
    const pids = { service: services.map((s) => s.pid), nats: [nats.child.pid], bare: [bare.pid] };
    return {
      natsUrl: nats.server.url,
      storeDir,
      taskUrl,
      jobUrl,
      bareUrl,
      nc: handle.nc,
      pids,
      groups: (serviceGroup) => ({ service: pids[serviceGroup], nats: pids.nats }),
      deaths: () => exitedChildren([nats.child, ...services, bare]),
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
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

// The system under test for `--microvm`: a private `nats-server -js` and the service
// (`dist/main.mjs`, all roles, so the microVM host runs) as child processes, built and started
// as bench/environment.ts does, with every port free (MICROVM_API_PORT too), a temporary
// DATA_DIR (token key, host lock, bundles) and a raised MICROVM_MAX_INSTANCES.
import { mkdtemp, rm } from "node:fs/promises";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { natsClient, type Client } from "../client/index.ts";
import { connectNats, freePort, type NatsHandle } from "../platform/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { childProcessesWith, INSTANCE_MARKER } from "../vm-runtime/index.ts";
import { exitedChildren, spawnBuilt, startNats, stopAll, waitForHttp, type Child } from "./children.ts";
import { processesMentioning } from "./microvm-proc.ts";

export type MicrovmClient = Client<typeof microvmApi>;

export interface MicrovmEnvironment {
  natsUrl: string;
  microvmUrl: string;
  /** The service's DATA_DIR; every instance's command line contains it. */
  dataDir: string;
  servicePid: number;
  natsPid: number;
  maxInstances: number;
  /** The bench's own connection (noAsyncTraces on). */
  nc: NatsConnection;
  /** RunMicrovm & co. straight over NATS, on `nc`. */
  api: MicrovmClient;
  /** Pids of the host's live instance processes (children of the service with the marker). */
  instancePids(): number[];
  deaths(): string[];
  /** Terminates every instance the API still lists as live; resolves with how many. */
  terminateAll(): Promise<number>;
  /** Terminates instances, stops the children, removes the temporary directories. */
  close(): Promise<void>;
}

export interface MicrovmEnvironmentOptions {
  maxInstances: number;
  /** Directory for `node --cpu-prof` profiles of the service. */
  cpuProfDir?: string;
}

/** Settings a caller's shell might carry; the bench sets its own. */
const serviceEnvKeys = [
  "NATS_URL", "DATA_DIR", "NATS_PORT", "HOST", "TASK_API_PORT", "JOB_API_PORT", "MICROVM_API_PORT", "NATS_SUBJECT_PREFIX",
  "BODY_LIMIT_BYTES", "REQUEST_TIMEOUT_MS", "KV_REPLICAS", "LOG_LEVEL", "NODE_OPTIONS", "GATEWAY_LOCAL_READS",
  "READ_CACHE_ENTRIES", "MICROVM_HOST_ID", "MICROVM_TOKEN_SECRET", "MICROVM_MAX_INSTANCES", "MICROVM_RETENTION_SECONDS",
  "MICROVM_PROXY_HOST", "MICROVM_PROXY_BIND", "METRICS_PORT",
];

export async function startMicrovmEnvironment(options: MicrovmEnvironmentOptions): Promise<MicrovmEnvironment> {
  const storeDir = await mkdtemp(join(tmpdir(), "bench-nats-"));
  const dataDir = await mkdtemp(join(tmpdir(), "bench-microvm-data-"));
  const removeDirs = () => Promise.all([storeDir, dataDir].map((dir) => rm(dir, { recursive: true, force: true })));
  process.once("exit", () => [storeDir, dataDir].forEach((dir) => rmSync(dir, { recursive: true, force: true })));
  let handle: NatsHandle | undefined;
  let api: MicrovmClient | undefined;
  let service: Child | undefined;
  const serviceUp = () => service !== undefined && service.process.exitCode === null && service.process.signalCode === null;
  const terminateAll = async () => (api && serviceUp() ? terminateListed(api) : 0);
  let closing: Promise<void> | undefined;
  // Once only (Ctrl-C and the run's own `finally` may both ask). A service already stopping
  // (Ctrl-C reaches it too) terminates its instances itself.
  const close = () =>
    (closing ??= (async () => {
      await withTimeout(terminateAll(), 20_000).catch((err: unknown) => console.error(`terminating instances: ${(err as Error).message}`));
      await handle?.close().catch(() => {});
      await stopAll();
      await removeDirs();
    })());
  try {
    const nats = await startNats(storeDir);
    const [taskPort, jobPort, microvmPort] = [await freePort(), await freePort(), await freePort()];
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const key of serviceEnvKeys) delete env[key];
    Object.assign(env, {
      LOG_LEVEL: "warn",
      NATS_URL: nats.server.url,
      DATA_DIR: dataDir,
      TASK_API_PORT: String(taskPort),
      JOB_API_PORT: String(jobPort),
      MICROVM_API_PORT: String(microvmPort),
      MICROVM_MAX_INSTANCES: String(options.maxInstances),
    });
    const nodeFlags = options.cpuProfDir ? ["--cpu-prof", `--cpu-prof-dir=${options.cpuProfDir}`] : [];
    const started = (service = await spawnBuilt("service", "main.ts", [], env, nodeFlags));
    const microvmUrl = `http://127.0.0.1:${microvmPort}`;
    await waitForHttp(microvmUrl, started);
    handle = await connectNats({ servers: nats.server.url, name: "bench-microvm" });
    api = natsClient(microvmApi, handle.nc, { timeoutMs: 10_000 });
    return {
      natsUrl: nats.server.url,
      microvmUrl,
      dataDir,
      servicePid: started.pid,
      natsPid: nats.child.pid,
      maxInstances: options.maxInstances,
      nc: handle.nc,
      api,
      instancePids: () => childProcessesWith(started.pid, INSTANCE_MARKER),
      deaths: () => exitedChildren([nats.child, started]),
      terminateAll,
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

const liveStates = new Set(["PENDING", "RUNNING", "SUSPENDING", "SUSPENDED", "FAILED"]);

async function terminateListed(api: MicrovmClient): Promise<number> {
  const { items } = await api.listMicrovms({});
  const live = items.filter((vm) => liveStates.has(vm.state));
  await Promise.all(live.map((vm) => api.terminateMicrovm({ microvmIdentifier: vm.microvmId }).catch(() => undefined)));
  return live.length;
}

/** Instance processes of this run (host-started or by hand) still alive: there must be none. */
export async function leftoverInstances(markers: string[], waitMs = 3_000): Promise<{ pid: number; cmdline: string }[]> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const found = processesMentioning(markers);
    if (found.length === 0 || Date.now() > deadline) return found;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms))),
  ]);
}

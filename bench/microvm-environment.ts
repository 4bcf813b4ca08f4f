// The system under test for `--microvm`: a private `nats-server -js` and the service
// (`dist/main.mjs`, all roles, so the microVM host runs) as child processes started by stacks.ts
// as the task bench's are, on free ports it reports (MICROVM_API_PORT too), a temporary
// DATA_DIR (token key, host lock, bundles), a raised MICROVM_MAX_INSTANCES and quota, one provider
// (MICROVM_PROVIDER) and a host id of its own (so its sandbox cgroups can be found).
import { basename } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { natsClient, type Client } from "../client/index.ts";
import { connectNats, type NatsHandle } from "../platform/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { exitedChildren, once, tempDir, type Child } from "./children.ts";
import {
  instancesOf,
  pidsInHostCgroups,
  removeHostCgroups,
  thawHostCgroups,
  type InstanceProcs,
  type ProviderName,
} from "./microvm-instance-procs.ts";
import { profileFlags, startNats, startService } from "./stacks.ts";
import { cmdlineOf, processesMentioning } from "./proc.ts";

export type MicrovmClient = Client<typeof microvmApi>;

export interface MicrovmEnvironment {
  provider: ProviderName;
  /** MICROVM_HOST_ID: names the host's cgroups (sandbox). */
  hostId: string;
  natsUrl: string;
  microvmUrl: string;
  /** The service's DATA_DIR; every process-provider instance's command line contains it. */
  dataDir: string;
  servicePid: number;
  natsPid: number;
  maxInstances: number;
  /** The bench's own connection (noAsyncTraces on). */
  nc: NatsConnection;
  /** RunMicrovm & co. straight over NATS, on `nc`. */
  api: MicrovmClient;
  /** The host's live instances (children of the service with the provider's marker), with their trees. */
  instances(): InstanceProcs[];
  deaths(): string[];
  /** Terminates every instance the API still lists as live; resolves with how many. */
  terminateAll(): Promise<number>;
  /** Terminates instances, stops the children, removes the temporary directories. */
  close(): Promise<void>;
}

export interface MicrovmEnvironmentOptions {
  provider: ProviderName;
  maxInstances: number;
  /** Directory for `node --cpu-prof` profiles of the service. */
  cpuProfDir?: string;
  /** Extra service settings (e.g. `MICROVM_CPUS` to see what the sandbox's CPU quota costs). */
  serviceEnv?: Record<string, string>;
}

export async function startMicrovmEnvironment(options: MicrovmEnvironmentOptions): Promise<MicrovmEnvironment> {
  const store = await tempDir("bench-nats-");
  const data = await tempDir("bench-microvm-data-");
  const dataDir = data.path;
  const hostId = `bench-${options.provider}-${basename(dataDir).slice(-6)}`;
  let handle: NatsHandle | undefined;
  let api: MicrovmClient | undefined;
  let nats: Awaited<ReturnType<typeof startNats>> | undefined;
  let service: Child | undefined;
  const serviceUp = () =>
    service !== undefined && service.process.exitCode === null && service.process.signalCode === null;
  const terminateAll = async () => (api && serviceUp() ? terminateListed(api) : 0);
  // A service already stopping (Ctrl-C reaches it too) terminates its instances itself.
  const close = once(async () => {
    await withTimeout(terminateAll(), 20_000).catch((err: unknown) =>
      console.error(`terminating instances: ${(err as Error).message}`),
    );
    await handle?.close().catch(() => {});
    // This environment's children only: the other provider's may still be measured.
    if (service) await service.stop();
    if (nats) await nats.child.stop();
    await Promise.all([store.remove(), data.remove()]);
  });
  try {
    nats = await startNats(store.path);
    const started = await startService({
      name: "service",
      roleSets: ["all"],
      natsUrl: nats.server.url,
      dataDir,
      runDir: store.path,
      nodeFlags: profileFlags(options.cpuProfDir),
      env: {
        MICROVM_MAX_INSTANCES: String(options.maxInstances),
        // One principal launches every instance: its quota must not stop the density step first.
        MICROVM_QUOTA_PER_PRINCIPAL: String(options.maxInstances),
        MICROVM_PROVIDER: options.provider,
        MICROVM_HOST_ID: hostId,
        ...options.serviceEnv,
      },
    });
    const servicePid = (service = started.children[0]!).pid;
    handle = await connectNats({ servers: nats.server.url, name: "bench-microvm" });
    api = natsClient(microvmApi, handle.nc, { timeoutMs: 10_000 });
    const children = [nats.child, service];
    return {
      provider: options.provider,
      hostId,
      natsUrl: nats.server.url,
      microvmUrl: `http://127.0.0.1:${started.ports.microvm}`,
      dataDir,
      servicePid,
      natsPid: nats.child.pid,
      maxInstances: options.maxInstances,
      nc: handle.nc,
      api,
      instances: () => instancesOf(servicePid, options.provider),
      deaths: () => exitedChildren(children),
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

/**
 * Instance processes of this run still alive (there must be none): process-provider instances
 * and runtimes by hand by a directory in their command line, sandbox instances by the cgroup
 * tree of `hostIds` (bwrap's command line names no host directory).
 */
export async function leftoverInstances(
  markers: string[],
  hostIds: string[] = [],
  waitMs = 3_000,
): Promise<{ pid: number; cmdline: string }[]> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const found = processesMentioning(markers);
    const seen = new Set(found.map((p) => p.pid));
    for (const pid of hostIds.flatMap(pidsInHostCgroups)) {
      if (!seen.has(pid) && pid !== process.pid) found.push({ pid, cmdline: cmdlineOf(pid) || "(gone)" });
    }
    if (found.length === 0 || Date.now() > deadline) return found;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Thaws the cgroups of this run's sandbox hosts, so a SIGKILL to what is left takes effect. */
export const thawCgroupsOf = async (hostIds: string[]) => {
  for (const hostId of hostIds) await thawHostCgroups(hostId);
};

/** Removes the (empty) cgroups the sandbox hosts of this run made. */
export const removeCgroupsOf = async (hostIds: string[]) => {
  for (const hostId of hostIds) await removeHostCgroups(hostId);
};

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms))),
  ]);
}

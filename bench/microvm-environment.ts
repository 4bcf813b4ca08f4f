// The system under test for `--microvm`: a private `nats-server -js` and the service
// (`dist/main.mjs`, all roles, so the microVM host runs) as child processes started by stacks.ts
// as the task bench's are, on free ports it reports (MICROVM_API_PORT too), a temporary
// DATA_DIR (token key, host lock, bundles), a raised MICROVM_MAX_INSTANCES and quota, one provider
// (MICROVM_PROVIDER) and a host id of its own (so its sandbox cgroups can be found); and the
// run's clean-up: every environment closed, then no instance process of the run left; one service
// for a measurement with its own clean-up (withMicrovmEnvironment).
import { rm } from "node:fs/promises";
import { basename } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { natsClient } from "../client/index.ts";
import { connectNats, type NatsHandle } from "../platform/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { cleanUpOnInterrupt, exitedChildren, once, tempDir, type Child } from "./children.ts";
import {
  hostCgroupKey,
  instancesOf,
  leftoverInstances,
  removeHostCgroups,
  thawHostCgroups,
  type InstanceProcs,
  type ProviderName,
} from "./microvm-instance-procs.ts";
import { profileFlags, startNats, startService } from "./stacks.ts";
import { launchedIds, type MicrovmClient } from "./microvm-instances.ts";

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

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms))),
  ]);
}

/**
 * Stops the services and the runtimes by hand, then checks that no instance process of this run
 * is left (killing any), and removes its cgroups and the isolated hosts' run directories. This
 * run's only: another bench running beside this one keeps its instances.
 */
export async function cleanUpRun(envs: MicrovmEnvironment[], direct?: { workDir: string; close(): Promise<void> }) {
  await direct?.close();
  await Promise.all(envs.map((env) => env.close()));
  // A gVisor instance's runsc processes name the host's run directory (their --root), not DATA_DIR.
  const runDirs = envs.map((env) => `typed-service-microvms/${hostCgroupKey(env.hostId)}/`);
  const markers = [...envs.map((env) => env.dataDir), ...runDirs, ...(direct ? [direct.workDir] : [])];
  const hostIds = envs.map((env) => env.hostId);
  await assertNoInstanceLeft(markers, hostIds).finally(async () => {
    await removeHostCgroups(hostIds);
    // The isolated hosts' run directories (instance sockets, runsc state) when a stop left them.
    for (const id of hostIds)
      await rm(`/run/typed-service-microvms/${hostCgroupKey(id)}`, { recursive: true, force: true });
  });
}

/** Every instance process of this run (host-started or by hand) must be gone; any left is killed. */
async function assertNoInstanceLeft(markers: string[], hostIds: string[]): Promise<void> {
  const left = await leftoverInstances(markers, hostIds);
  if (left.length) await thawHostCgroups(hostIds);
  for (const { pid } of left) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // Gone meanwhile.
    }
  }
  if (left.length)
    throw new Error(
      `instance processes left after the bench (killed now): ${left.map((p) => `${p.pid} ${p.cmdline}`).join("; ")}`,
    );
  console.log(`\ncleanup: ${launchedIds.size} instances launched, all terminated; no instance process left`);
}

/** One provider's service, `measure` on it, then its clean-up (also on error and Ctrl-C). */
export async function withMicrovmEnvironment<T>(
  options: MicrovmEnvironmentOptions,
  intro: string,
  measure: (env: MicrovmEnvironment) => Promise<T>,
): Promise<T> {
  const env = await startMicrovmEnvironment(options);
  const cleanUp = cleanUpOnInterrupt(() => cleanUpRun([env]));
  console.log(`${options.provider}: service pid ${env.servicePid}, nats-server pid ${env.natsPid}; ${intro}…`);
  try {
    return await measure(env);
  } finally {
    await cleanUp();
  }
}

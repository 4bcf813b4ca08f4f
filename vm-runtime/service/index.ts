// Public entry of the microVM host actor: `startMicrovmHost(nc, options)` reconciles what an
// earlier run of this host id left, then serves the seven microVM operations (queue groups
// `microvms.<op>` and the gateway's `microvms.gateway.<op>` shared by every host, plus this
// host's own `microvms.host.<token>.<op>`), each request as its caller's principal.
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { KV } from "@nats-io/kv";
import type { Msg, NatsConnection } from "@nats-io/transport-node";
import {
  callObject,
  microvmApi,
  PRINCIPAL_HEADER,
  serviceNames,
  viaGateway,
  type InputOf,
} from "../../schemas/index.ts";
import { builtinImages } from "../images/paths.ts";
import type { LifecycleTimeouts } from "../lifecycle/types.ts";
import type { TokenKey } from "../wire/token.ts";
import {
  HeldRequests,
  log,
  microvmBoots,
  microvmInstances,
  microvmLogWaits,
  microvmObjectsActive,
  onScrape,
  provisionBuckets,
  provisionObjectStreams,
  Requester,
} from "../../platform/index.ts";
import {
  objectAlarms,
  objectDirectory,
  objectHibernation,
  objectStores,
  openObjectSession,
  startAlarmFiring,
  startObjectActivations,
  type HostObjectActivations,
  type ObjectActivationsOptions,
  type OpenSession,
} from "../objects/index.ts";
import { MicroService, processMetadata } from "../../actors/discovery.ts";
import { inProcessOperation, serveApi, type Handler } from "../../actors/serve.ts";
import type { InProcessRoute } from "../../placement/index.ts";
import { defaultHostId, hostWorkDir, loadTokenKeyring, lockHost } from "./config.ts";
import { queueHandlers, type HostState } from "./handlers.ts";
import { HostInstances } from "./host-instances.ts";
import { InstanceLogs, type InstanceLogOptions } from "./logs.ts";
import { hostOwners, hostSubject } from "./owners.ts";
import { hostRevocations, type HostRevocations } from "./revocations.ts";
import { DeferStack } from "./defer-stack.ts";
import { launchHosted } from "./hosted.ts";
import { createHostProvider, type InstanceLimits, type ProviderName } from "./provider.ts";
import { reconcileHost, survivesHost, type ReconcileReport } from "./reconcile.ts";
import { registerBuiltinImages } from "../registry/handlers.ts";
import { ImageStore, type ImageQuota, type ImageStoreOptions } from "../registry/store.ts";
import { SnapshotStore } from "../snapshots/store.ts";
import { LOCAL_SNAPSHOTS_DIR } from "../snapshots/keeper.ts";
import { isTerminal, MicrovmStore, ownerOf, type StoredRecord } from "./store.ts";
import { startSweeper, type SweepReport } from "./sweeper.ts";
import { StateReason } from "../wire/state-reasons.ts";

export { defaultHostId, hostWorkDir, loadTokenKey } from "./config.ts";
export { hostCgroupKey, ProviderUnavailable, type InstanceLimits, type ProviderName } from "./provider.ts";
export { REASON_PROCESS_GONE, REASON_PROCESS_KILLED, type ReconcileReport } from "./reconcile.ts";
export { keyedMicrovmId } from "./handlers.ts";
export { hostSubject, hostGoneReason } from "./owners.ts";
export type { InstanceOp } from "./operations.ts";
export { MicrovmStore, type MicrovmRecord, type StoredHandle } from "./store.ts";
export type { SweepReport } from "./sweeper.ts";

// The host's pieces, for those who run instances without the service (benches, tests, tools).
export { builtinImages } from "../images/paths.ts";
export { bundleImage } from "../host/bundle.ts";
export { bundleImageModule } from "../client/image-module.ts";
export { createProcessProvider } from "../host/process-provider.ts";
export type { ProcessProvider, ProcessProviderOptions } from "../host/process-provider.ts";
export { createSandboxProvider } from "../host/sandbox-provider.ts";
export type { SandboxProvider, SandboxProviderOptions } from "../host/sandbox-provider.ts";
export { checkSandbox } from "../host/sandbox-check.ts";
export { checkGvisor, createGvisorProvider, findRunsc } from "../host/gvisor-provider.ts";
export type { GvisorProvider, GvisorProviderOptions } from "../host/gvisor-provider.ts";
export type { IsolatedProvider, IsolatedProviderOptions } from "../host/isolated-provider.ts";
export {
  hostFailureOf,
  MicrovmHostError,
  MicrovmImageTimeout,
  MicrovmProviderError,
  MicrovmStartFailed,
  RUNTIME_PORT,
  upstreamOf,
} from "../host/provider.ts";
export type {
  MicrovmHandle,
  MicrovmProvider,
  MicrovmSpec,
  ReclaimedInstance,
  RestoreSpec,
  Upstream,
} from "../host/provider.ts";
export { launchMicrovmInstance } from "../lifecycle/instance.ts";
export type { InstanceSnapshots, MicrovmInstance, MicrovmInstanceOptions } from "../lifecycle/instance.ts";
export { lifecycleMachine } from "../lifecycle/machine.ts";
export { canAccept, microvmState } from "../lifecycle/snapshot.ts";
export type { LifecycleActor, LifecycleMachine, LifecycleSnapshot } from "../lifecycle/snapshot.ts";
export { DEFAULT_TIMEOUTS, SuspendRefused } from "../lifecycle/types.ts";
export type { LifecycleEvent, LifecycleTimeouts, SavedSnapshot } from "../lifecycle/types.ts";
export { createInstanceProxy } from "../host/proxy.ts";
export type { InstanceProxy, InstanceProxyOptions, ProxiedInstance } from "../host/proxy.ts";
export {
  createAuthToken,
  InvalidTokenRequest,
  MAX_TOKEN_CLOCK_SKEW_MS,
  MAX_TOKEN_LIFETIME_MS,
  tokenKeyId,
  verifyAuthToken,
} from "../wire/token.ts";
export type { TokenKey, TokenKeyring } from "../wire/token.ts";

export interface MicrovmHostOptions {
  /** The `microvms` bucket (from `openBuckets`; every store is made first by `provisionMicrovmStores`). */
  readonly kv: KV;
  /** Holds the token key file and the instance work directory (`DATA_DIR`). */
  readonly dataDir: string;
  /** Unique per host process (`MICROVM_HOST_ID`); default `<hostname>-<hash of dataDir>`. */
  readonly hostId?: string;
  /** Token signing key; default `tokenSecret`, else a random key kept in `dataDir` (0600). */
  readonly tokenKey?: TokenKey;
  /** `MICROVM_TOKEN_SECRET`: at least 32 bytes. */
  readonly tokenSecret?: string;
  /** `MICROVM_TOKEN_SECRET_PREVIOUS`: the secret before a rotation, still accepted. */
  readonly tokenSecretPrevious?: string;
  /** Subject prefix (empty for none). */
  readonly prefix?: string;
  /** Built-in images registered at start, name → module path (default: the example `sandbox` image only). */
  readonly images?: Readonly<Record<string, string>>;
  /** JetStream replicas of the image buckets (default 1). */
  readonly replicas?: number;
  /**
   * Bound of this host's cache of image modules in MiB (`MICROVM_IMAGE_CACHE_MIB`, default
   * 256): modules no live instance uses are evicted least recently used first.
   */
  readonly imageCacheMiB?: number;
  /** Stored versions and bytes of images per principal (defaults 50 and 64 MiB); 429 past either. */
  readonly imageQuota?: ImageQuota;
  /** `max_bytes` of the image object store in MiB (`MICROVM_IMAGE_STORE_MIB`, default 1024). */
  readonly imageStoreMiB?: number;
  /**
   * Suspend checkpoints instances into stored snapshots where the provider can (gVisor), so a
   * SUSPENDED instance holds no process and survives its host (default; `false`,
   * `MICROVM_SNAPSHOTS=0`, keeps the freezer, as on providers that cannot checkpoint).
   */
  readonly snapshots?: boolean;
  /** Bytes of stored snapshots per principal in MiB (`MICROVM_SNAPSHOT_QUOTA_MIB`, default 256). */
  readonly snapshotQuotaMiB?: number;
  /** `max_bytes` of the snapshot object store in MiB (`MICROVM_SNAPSHOT_STORE_MIB`, default 1024). */
  readonly snapshotStoreMiB?: number;
  /**
   * Isolation (`MICROVM_PROVIDER`): `auto` (default: gvisor, else sandbox), `gvisor`, `sandbox`
   * or `process` (development, not isolated).
   */
  readonly provider?: ProviderName;
  /** Per-instance limits of the sandbox. */
  readonly limits?: InstanceLimits;
  /** Live instances per host (default 50). */
  readonly maxInstances?: number;
  /** Live instances per principal over all hosts (`MICROVM_QUOTA_PER_PRINCIPAL`, default 10). */
  readonly quotaPerPrincipal?: number;
  /**
   * The principal of callers on the public `microvms.<op>` subjects: in one NATS account the
   * server does not say who published, so it is the one NATS user allowed to publish there
   * (default `nats:internal`, the generated config's `internal` user).
   */
  readonly natsPrincipal?: string;
  /** How long TERMINATED/FAILED records stay readable (default 600 s). */
  readonly retentionSeconds?: number;
  /** Host written into endpoints (default 127.0.0.1), and the address proxies bind (default: the same). */
  readonly proxyHost?: string;
  readonly proxyBindHost?: string;
  /**
   * Longest wait for a terminate to settle before answering (default 3 s); suspend and resume
   * wait up to their contract's SUSPEND_WAIT_MS / RESUME_WAIT_MS.
   */
  readonly settleMs?: number;
  /** Time for an owner's answer to a forwarded request (default 4 s, below the gateway's 5 s). */
  readonly forwardTimeoutMs?: number;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** Time between retention sweeps (default: half the retention, 1 s to 30 s). */
  readonly sweepIntervalMs?: number;
  /**
   * Limits of the instance log stream (`MICROVM_LOG_LINES`, `MICROVM_LOG_MAX_AGE_SECONDS`,
   * `MICROVM_LOG_STORE_MIB`).
   */
  readonly logLimits?: Omit<InstanceLogOptions, "replicas">;
  /** Objects (user code with a name) run on this host: their limits, and how a session opens. */
  readonly objects?: ObjectHostOptions;
}

/** The settings of the objects a host runs. */
export type ObjectHostOptions = Partial<
  Pick<
    ObjectActivationsOptions,
    | "maxPending"
    | "maxActive"
    | "maxActivePerPrincipal"
    | "callTimeoutMs"
    | "startTimeoutMs"
    | "stopHibernateMs"
    | "leaseTtlMs"
    | "relayTimeoutMs"
  >
> & {
  /** Opens the session with an object's instance (default `openObjectSession`). */
  readonly openSession?: OpenSession;
};

export interface MicrovmHost {
  readonly hostId: string;
  /** Where instance bundles live; every instance's command line contains it. */
  readonly workDir: string;
  /** What the start-up reconcile did. */
  readonly reconciled: ReconcileReport;
  /** Instances of this host that are not yet TERMINATED or FAILED. */
  liveInstances(): string[];
  /** Runs a retention sweep now. */
  sweep(): Promise<SweepReport>;
  /** The cluster's objects as this host reaches them, and those active on it. */
  readonly objects: HostObjectActivations;
  /**
   * What a gateway in this process may serve here without NATS (its `inProcess`): a call to an
   * object active on this host (any other goes on its subject, so new activations spread).
   */
  readonly inProcess: ReadonlyMap<string, InProcessRoute>;
  /** Stops serving, terminates every instance of this host, closes the proxies. */
  close(): Promise<void>;
}

/** What the provisioning step needs to make the host's stores: their replicas and limits. */
export type MicrovmStoreOptions = Pick<
  MicrovmHostOptions,
  "replicas" | "imageStoreMiB" | "snapshots" | "snapshotStoreMiB" | "logLimits"
>;

/**
 * Makes the microVM host's stores, or brings existing ones to these limits: the `microvms` and
 * `images` buckets, the image and snapshot object stores (the latter unless snapshots are off)
 * and the instance log stream. With the provisioning credential, before any host starts: a host
 * opens them as they are (`startMicrovmHost`) and may change no stream's configuration.
 */
export async function provisionMicrovmStores(nc: NatsConnection, options: MicrovmStoreOptions = {}): Promise<void> {
  const replicas = options.replicas === undefined ? {} : { replicas: options.replicas };
  await provisionBuckets(nc, { ...replicas, only: ["microvms"] });
  await ImageStore.provision(nc, {
    ...replicas,
    ...(options.imageStoreMiB === undefined ? {} : { storeMiB: options.imageStoreMiB }),
  });
  if (options.snapshots !== false)
    await SnapshotStore.provision(nc, {
      ...replicas,
      ...(options.snapshotStoreMiB === undefined ? {} : { storeMiB: options.snapshotStoreMiB }),
    });
  await InstanceLogs.provision(nc, { ...replicas, ...options.logLimits });
  await provisionObjectStreams(nc, replicas);
}

export async function startMicrovmHost(nc: NatsConnection, options: MicrovmHostOptions): Promise<MicrovmHost> {
  const prefix = options.prefix ?? "";
  const hostId = options.hostId || defaultHostId(options.dataDir);
  const workDir = hostWorkDir(options.dataDir, hostId);
  const undo = new DeferStack();
  const { tokenKey, store, logs, provider, reconciled, images, snapshots, revocations } = await undo.unwindOnFailure(
    () => openHostParts(nc, options, hostId, workDir, undo),
  );
  const proxyHost = options.proxyHost ?? "127.0.0.1";
  const requester = new Requester(nc);
  undo.defer(() => requester.close());
  const objectStorage = objectStores(requester);
  const alarms = objectAlarms(requester);
  const directory = objectDirectory(requester);
  const objects = startObjectActivations({
    ...options.objects,
    nc,
    requester,
    prefix,
    hostId,
    images,
    provider,
    stores: objectStorage,
    alarms,
    directory,
    openSession: options.objects?.openSession ?? openObjectSession,
    output: logs,
    // Hibernating objects keep their memory where instances are suspended into snapshots.
    ...(snapshots && provider.checkpoint
      ? { hibernation: objectHibernation({ store: snapshots, provider, workDir }) }
      : {}),
  });
  const held = new HeldRequests(nc, prefix);
  const host: HostState = {
    nc,
    prefix,
    hostId,
    store,
    tokenKey,
    images,
    logs,
    held,
    settleMs: options.settleMs ?? 3_000,
    forwardTimeoutMs: options.forwardTimeoutMs ?? 4_000,
    instances: new HostInstances({
      store,
      maxInstances: options.maxInstances ?? 50,
      quotaPerPrincipal: options.quotaPerPrincipal ?? 10,
    }),
    objects: {
      activations: objects,
      directory,
      stores: objectStorage,
      alarms,
      logs,
      held,
    },
    launch: {
      hostId,
      store,
      provider,
      tokenKey,
      tokenRevoked: revocations.revoked,
      proxyHost,
      proxyBindHost: options.proxyBindHost ?? proxyHost,
      ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
      ...(snapshots ? { snapshots: { store: snapshots, workDir } } : {}),
    },
  };

  revocations.cutAt(() => host.instances.values());
  // What an earlier run of this host suspended into snapshots is this run's again.
  for (const stored of await store.list()) {
    if (stored.record.hostId === hostId && survivesHost(stored.record)) await adopt(host, stored);
  }

  // This host's own subjects first: a record naming this host must find it answering.
  const ping = nc.subscribe(hostSubject(prefix, hostId, "ping"), {
    callback: (_err, msg) => {
      msg.respond();
    },
  });
  const service = new MicroService(nc, {
    name: serviceNames.microvms,
    description: "MicroVM instances and images",
    metadata: processMetadata(prefix, { host_id: hostId }),
  });
  const shared = queueHandlers(host);
  const natsPrincipal = options.natsPrincipal ?? "nats:internal";
  const queue = (op: { name: string }) => `microvms.${op.name}`;
  // Instance operations run on the instance's host: on this host's own subjects too, where
  // other hosts pass requests on (no queue group: only this host serves them).
  const owners = { byHost: hostOwners(host) };
  const served = serveApi(nc, microvmApi, shared, {
    prefix,
    queue,
    principal: () => natsPrincipal,
    discovery: { service },
    owners,
  });
  // The gateway's copies: the same queue groups, the principal from its header.
  const viaGatewayServed = serveApi(nc, microvmApi, shared, {
    prefix,
    queue,
    serveAs: viaGateway,
    principal: fromHeader,
    discovery: { service, name: (op) => `${op.name}-gateway` },
    owners,
    ownSubjects: false,
  });
  const own = served.own;
  const queued = [...served.shared, ...viaGatewayServed.shared];
  const sweeper = startSweeper({
    store,
    nc,
    prefix,
    hostId,
    retentionMs: (options.retentionSeconds ?? 600) * 1000,
    liveInstances: () => host.instances.ids(),
    disowned: (microvmId, reason) => {
      const hosted = host.instances.get(microvmId);
      if (!hosted || isTerminal(hosted.state())) return;
      log.warn({ microvmId, reason }, "microvm record ended elsewhere; terminating the instance");
      hosted.disown();
      hosted.instance.send({ type: "TERMINATE", reason });
    },
    // A record ended by reconcile or a gone host's sweep had no machine to delete its snapshot.
    ...(snapshots ? { discardSnapshot: (record) => snapshots.delete(ownerOf(record), record.microvmId) } : {}),
    // A gone host's instances suspended into snapshots are taken over, not ended.
    ...(snapshots ? { adopt: (stored) => adopt(host, stored) } : {}),
    ...(options.sweepIntervalMs === undefined ? {} : { intervalMs: options.sweepIntervalMs }),
  });
  // Due alarms of any object wake it, here or at the host that holds it.
  const alarmFiring = await startAlarmFiring(nc, objects.fireAlarm);
  // Serving means subscribed at the server: a request right after this finds its responder.
  await nc.flush();
  log.info({ hostId, workDir, reconciled }, "microvm host serving");
  const stopCounting = onScrape(() => {
    microvmInstances.reset();
    for (const hosted of host.instances.values()) microvmInstances.inc({ state: hosted.state() });
    microvmLogWaits.set(logs.waiting);
    microvmObjectsActive.set(objects.activeHere().length);
    if ("boots" in provider) {
      const { running, waiting, ready } = provider.boots();
      microvmBoots.set({ state: "running" }, running);
      microvmBoots.set({ state: "waiting" }, waiting);
      microvmBoots.set({ state: "ready" }, ready);
    }
  });

  let closed: Promise<void> | undefined;
  return {
    hostId,
    workDir,
    reconciled,
    liveInstances: () => host.instances.ids(),
    sweep: () => sweeper.sweep(),
    objects,
    inProcess: new Map([["callObject", objectCallsHere(objects, shared.callObject)]]),
    close: () => (closed ??= shutdown()),
  };

  async function shutdown(): Promise<void> {
    const launched = host.instances.close();
    stopCounting();
    // Long polls under way answer now (what they have) rather than at the end of their wait.
    host.held.close();
    await Promise.all([...queued.map((sub) => sub.drain().catch(() => undefined)), service.close()]);
    await sweeper.stop();
    // Objects stop here: their calls answered, instances stopped, leases released for other hosts.
    await alarmFiring.close();
    await objects.close();
    await launched;
    await Promise.all(
      host.instances.values().map(async (hosted) => {
        // SUSPENDED into a snapshot, it outlives this host: the next (or another) adopts it.
        if (await hosted.leave()) return;
        hosted.instance.send({ type: "TERMINATE", reason: StateReason.HostShutdown });
        await hosted.gone;
      }),
    );
    await Promise.all([...own, ping].map((sub) => sub.drain().catch(() => undefined)));
    // The provider, the revocation watch and the host's lock.
    await undo.unwind();
    log.info({ hostId }, "microvm host stopped");
  }
}

/**
 * Takes over a SUSPENDED instance whose snapshot is stored (of an earlier run of this host, or
 * of a gone one): its record names this host and a new endpoint, and a resume restores it
 * here; true when this host won it (another may adopt it at the same moment).
 */
async function adopt(host: HostState, stored: StoredRecord): Promise<boolean> {
  const { record } = stored;
  if (host.instances.closing || host.instances.has(record.microvmId)) return false;
  const unkeep = host.logs.keep(record.microvmId, ownerOf(record));
  const hosted = await launchHosted({
    ...host.launch,
    microvmId: record.microvmId,
    owner: ownerOf(record),
    imageIdentifier: record.imageIdentifier,
    ...(record.imageDigest === undefined ? {} : { imageDigest: record.imageDigest }),
    // Never started: a restore brings back the module with the memory it was loaded into.
    image: "",
    idlePolicy: record.idlePolicy,
    adopt: stored,
    onGone: (gone) => {
      host.instances.remove(gone);
      unkeep();
    },
  }).catch((err: unknown) => {
    log.warn({ err, microvmId: record.microvmId }, "adopting a suspended instance failed");
    return undefined;
  });
  if (!hosted) {
    unkeep();
    return false;
  }
  host.instances.add(hosted);
  log.info({ microvmId: record.microvmId, from: record.hostId }, "adopted a suspended instance");
  return true;
}

/** What a host runs on: its lock, token key, stores, provider and revocation watch. */
interface HostParts {
  readonly tokenKey: TokenKey;
  readonly store: MicrovmStore;
  readonly logs: InstanceLogs;
  readonly provider: Awaited<ReturnType<typeof createHostProvider>>;
  readonly reconciled: ReconcileReport;
  readonly images: ImageStore;
  /** Where suspend keeps a snapshot (the provider checkpoints: gVisor); elsewhere it freezes. */
  readonly snapshots: SnapshotStore | undefined;
  readonly revocations: HostRevocations;
}

/**
 * Opens what the host runs on, deferring on `undo` how to give each part back (the caller
 * unwinds it when this or a later step fails, and at close); reconciles what an earlier run
 * of this host id left.
 */
async function openHostParts(
  nc: NatsConnection,
  options: MicrovmHostOptions,
  hostId: string,
  workDir: string,
  undo: DeferStack,
): Promise<HostParts> {
  undo.defer(await lockHost(workDir, hostId));
  // Closed after the provider, as the host closed them before this stack: deferred ahead of it.
  let revocations: HostRevocations | undefined;
  undo.defer(() => revocations?.close());
  const tokenKey =
    options.tokenKey ?? (await loadTokenKeyring(options.dataDir, options.tokenSecret, options.tokenSecretPrevious));
  const store = new MicrovmStore(options.kv, nc);
  const logs = await InstanceLogs.open(nc);
  const provider = await createHostProvider(options.provider ?? "auto", workDir, options.limits, logs.sink);
  undo.defer(() => provider.close());
  const keepSnapshots = provider.checkpoint !== undefined && options.snapshots !== false;
  const reconciled = await reconcileHost(store, hostId, workDir, provider, keepSnapshots);
  const builtins = options.images ?? { sandbox: builtinImages.sandbox };
  const images = await openImages(nc, join(workDir, "image-cache"), builtins, {
    ...(options.replicas === undefined ? {} : { replicas: options.replicas }),
    ...(options.imageCacheMiB === undefined ? {} : { cacheMiB: options.imageCacheMiB }),
    ...(options.imageQuota === undefined ? {} : { quota: options.imageQuota }),
    ...(options.imageStoreMiB === undefined ? {} : { storeMiB: options.imageStoreMiB }),
  });
  const snapshots = keepSnapshots
    ? await SnapshotStore.open(nc, {
        kv: images.kv,
        ...(options.snapshotQuotaMiB === undefined ? {} : { quotaBytes: options.snapshotQuotaMiB * 1024 * 1024 }),
      })
    : undefined;
  // Images an earlier run kept of its suspended instances: what it adopts loads the stored copy.
  await rm(join(workDir, LOCAL_SNAPSHOTS_DIR), { recursive: true, force: true });
  // In the background: the first instance then finds the runtime bundle ready (images need none).
  provider.prepare([]).catch((err: unknown) => log.warn({ err }, "bundling the runtime failed"));
  // Before any instance (adopted ones too) has a proxy: tokens of revoked API keys are refused.
  revocations = await hostRevocations(nc);
  return { tokenKey, store, logs, provider, reconciled, images, snapshots, revocations };
}

/** The image buckets, with the built-in images registered. */
async function openImages(
  nc: NatsConnection,
  cacheDir: string,
  builtins: Readonly<Record<string, string>>,
  options: ImageStoreOptions,
): Promise<ImageStore> {
  const images = await ImageStore.open(nc, cacheDir, options);
  await registerBuiltinImages(images, builtins);
  return images;
}

/** Calls to the objects active on this host, as the gateway beside it hands them over. */
function objectCallsHere(objects: HostObjectActivations, handler: Handler<typeof callObject>): InProcessRoute {
  const call = inProcessOperation(callObject, handler);
  return {
    here: (input, principal) => objects.holds({ principal, image: input.image as string, name: input.name as string }),
    call: (input, headers) => call(input as InputOf<typeof callObject>, headers),
  };
}

/** The principal a sender put in the header: believed only where its subject's permissions say who sent it. */
const fromHeader = (msg: Msg) => msg.headers?.get(PRINCIPAL_HEADER) || undefined;

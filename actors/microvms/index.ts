// Public entry of the microVM host actor: `startMicrovmHost(nc, options)` reconciles what an
// earlier run of this host id left, then serves the seven microVM operations (queue groups
// `microvms.<op>` shared by every host, plus this host's own `microvms.host.<token>.<op>`).
import type { KV } from "@nats-io/kv";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { microvmApi, type Operation } from "../../schemas/index.ts";
import {
  builtinImages,
  createProcessProvider,
  type LifecycleTimeouts,
  type TokenKey,
} from "../../vm-runtime/index.ts";
import { log, microvmInstances, onScrape } from "../../platform/index.ts";
import { serveOperation, type Handler } from "../serve.ts";
import { defaultHostId, hostWorkDir, loadTokenKey, lockHost } from "./config.ts";
import { ownerHandlers, queueHandlers, type HostState } from "./handlers.ts";
import { reconcileHost, type ReconcileReport } from "./reconcile.ts";
import { hostSubject, onHost } from "./routing.ts";
import { isTerminal, MicrovmStore } from "./store.ts";
import { startSweeper, type SweepReport } from "./sweeper.ts";

export { defaultHostId, hostWorkDir, loadTokenKey } from "./config.ts";
export { instanceProcessesUnder, REASON_PROCESS_GONE, REASON_PROCESS_KILLED, type ReconcileReport } from "./reconcile.ts";
export { hostSubject, hostGoneReason } from "./routing.ts";
export { MicrovmStore, type MicrovmRecord, type StoredHandle } from "./store.ts";
export type { SweepReport } from "./sweeper.ts";

export interface MicrovmHostOptions {
  /** The `microvms` bucket (from `openBuckets`). */
  readonly kv: KV;
  /** Holds the token key file and the instance work directory (`DATA_DIR`). */
  readonly dataDir: string;
  /** Unique per host process (`MICROVM_HOST_ID`); default `<hostname>-<hash of dataDir>`. */
  readonly hostId?: string;
  /** Token signing key; default `tokenSecret`, else a random key kept in `dataDir` (0600). */
  readonly tokenKey?: TokenKey;
  /** `MICROVM_TOKEN_SECRET`: at least 32 bytes. */
  readonly tokenSecret?: string;
  /** Subject prefix (empty for none). */
  readonly prefix?: string;
  /** Image identifier → module path (default: the built-in sandbox, probe and hog). */
  readonly images?: Readonly<Record<string, string>>;
  /** Live instances per host (default 50). */
  readonly maxInstances?: number;
  /** How long TERMINATED/FAILED records stay readable (default 600 s). */
  readonly retentionSeconds?: number;
  /** Host written into endpoints (default 127.0.0.1), and the address proxies bind (default: the same). */
  readonly proxyHost?: string;
  readonly proxyBindHost?: string;
  /** Longest wait for suspend/resume/terminate to settle before answering (default 3 s). */
  readonly settleMs?: number;
  /** Time for an owner's answer to a forwarded request (default 4 s, below the gateway's 5 s). */
  readonly forwardTimeoutMs?: number;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** Time between retention sweeps (default: half the retention, 1 s to 30 s). */
  readonly sweepIntervalMs?: number;
}

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
  /** Stops serving, terminates every instance of this host, closes the proxies. */
  close(): Promise<void>;
}

const instanceOps = [microvmApi.createAuthToken, microvmApi.suspendMicrovm, microvmApi.resumeMicrovm, microvmApi.terminateMicrovm];

export async function startMicrovmHost(nc: NatsConnection, options: MicrovmHostOptions): Promise<MicrovmHost> {
  const prefix = options.prefix ?? "";
  const hostId = options.hostId || defaultHostId(options.dataDir);
  const workDir = hostWorkDir(options.dataDir, hostId);
  const unlock = await lockHost(workDir, hostId);
  const tokenKey = options.tokenKey ?? (await loadTokenKey(options.dataDir, options.tokenSecret));
  const store = new MicrovmStore(options.kv, nc);
  const reconciled = await reconcileHost(store, hostId, workDir);
  const provider = createProcessProvider({
    workDir,
    onOutput: (microvmId, stream, line) => log.debug({ microvmId, stream, line }, "instance output"),
  });
  // In the background: the first RunMicrovm of an image then finds its bundle ready.
  provider.prepare(Object.values(options.images ?? builtinImages)).catch((err: unknown) => log.warn({ err }, "prebundling images failed"));
  const proxyHost = options.proxyHost ?? "127.0.0.1";
  const host: HostState = {
    nc,
    prefix,
    hostId,
    store,
    tokenKey,
    images: options.images ?? builtinImages,
    maxInstances: options.maxInstances ?? 50,
    settleMs: options.settleMs ?? 3_000,
    forwardTimeoutMs: options.forwardTimeoutMs ?? 4_000,
    instances: new Map(),
    launch: {
      hostId,
      store,
      provider,
      tokenKey,
      proxyHost,
      proxyBindHost: options.proxyBindHost ?? proxyHost,
      ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
    },
    launching: 0,
    closing: false,
  };

  // This host's own subjects first: a record naming this host must find it answering.
  const ping = nc.subscribe(hostSubject(prefix, hostId, "ping"), {
    callback: (_err, msg) => {
      msg.respond();
    },
  });
  const owned = ownerHandlers(host);
  const own = instanceOps.map((op) => serve(nc, onHost(op, hostId), owned[op.name as keyof typeof owned], prefix, ""));
  await nc.flush();
  const shared = queueHandlers(host);
  const queued = Object.values(microvmApi).map((op) =>
    serve(nc, op, shared[op.name as keyof typeof shared], prefix, `microvms.${op.name}`),
  );
  const sweeper = startSweeper({
    store,
    nc,
    prefix,
    hostId,
    retentionMs: (options.retentionSeconds ?? 600) * 1000,
    liveInstances: () => [...host.instances.keys()],
    disowned: (microvmId, reason) => {
      const hosted = host.instances.get(microvmId);
      if (!hosted || isTerminal(hosted.state())) return;
      log.warn({ microvmId, reason }, "microvm record ended elsewhere; terminating the instance");
      hosted.instance.send({ type: "TERMINATE", reason });
    },
    ...(options.sweepIntervalMs === undefined ? {} : { intervalMs: options.sweepIntervalMs }),
  });
  log.info({ hostId, workDir, reconciled }, "microvm host serving");
  const stopCounting = onScrape(() => {
    microvmInstances.reset();
    for (const hosted of host.instances.values()) microvmInstances.inc({ state: hosted.state() });
  });

  let closed: Promise<void> | undefined;
  return {
    hostId,
    workDir,
    reconciled,
    liveInstances: () => [...host.instances.keys()],
    sweep: () => sweeper.sweep(),
    close: () => (closed ??= shutdown()),
  };

  async function shutdown(): Promise<void> {
    host.closing = true;
    stopCounting();
    await Promise.all(queued.map((sub) => sub.drain().catch(() => undefined)));
    await sweeper.stop();
    while (host.launching > 0) await new Promise((r) => setTimeout(r, 10));
    await Promise.all(
      [...host.instances.values()].map(async (hosted) => {
        hosted.instance.send({ type: "TERMINATE", reason: "HostShutdown" });
        await hosted.gone;
      }),
    );
    await Promise.all([...own, ping].map((sub) => sub.drain().catch(() => undefined)));
    await provider.close();
    await unlock();
    log.info({ hostId }, "microvm host stopped");
  }
}

function serve(nc: NatsConnection, op: Operation, handler: unknown, prefix: string, queue: string): Subscription {
  // An empty queue name subscribes without a queue group (nats.js sends a plain SUB).
  return serveOperation(nc, op, handler as Handler<Operation>, { prefix, queue });
}

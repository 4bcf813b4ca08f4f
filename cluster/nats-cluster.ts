// A JetStream cluster of local `nats-server` processes on loopback: one store directory,
// client port and route port per node, full-mesh routes, and a wait for a meta leader.
import { once } from "node:events";
import { join } from "node:path";
import { jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { randomBytes } from "node:crypto";
import { connect } from "@nats-io/transport-node";
import {
  actorBuckets,
  authOptions,
  freePort,
  openBuckets,
  startNatsServer,
  type NatsCredentials,
  type NatsRole,
  type NatsServer,
} from "../platform/index.ts";

export interface NatsClusterOptions {
  /** Stores go to `<baseDir>/<node name>`. */
  readonly baseDir: string;
  /** Node names; also the servers' `server_name` (unique in a cluster). */
  readonly names: readonly string[];
  /** Client ports by node (0 or missing: a free port). */
  readonly clientPorts?: readonly number[];
  /** Route ports by node (0 or missing: a free port). */
  readonly routePorts?: readonly number[];
  readonly clusterName: string;
  /** Runs this binary instead of the one `natsServerPath()` finds. */
  readonly binary?: string;
  /** JetStream's `sync_interval` on every node (default: NATS_SYNC, else `1s`). */
  readonly sync?: string;
  /** The clients' `authorization {}` block (`authorizationConfig`); routes are authenticated either way. */
  readonly authorization?: string;
}

/** One node: its fixed ports and store, so it can be killed and started again as the same server. */
export interface NatsNode {
  readonly name: string;
  readonly url: string;
  readonly port: number;
  readonly routePort: number;
  readonly storeDir: string;
  /** The running server, undefined while stopped. */
  readonly server: NatsServer | undefined;
  /** Starts the node again on the same ports and store (after a kill or stop). */
  start(): Promise<void>;
  /** SIGKILL: a crash, no goodbye to the peers. */
  kill(): Promise<void>;
  /** SIGTERM, then SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

export interface NatsCluster {
  readonly nodes: readonly NatsNode[];
  /** Every node's URL, comma-separated (the NATS_URL of the services). */
  readonly url: string;
  stop(): Promise<void>;
}

/**
 * The `cluster {}` block of one node: listen on its route port, solicit every other node. With
 * `routePassword`, a route must authenticate as user `route` (no process can join as a node).
 */
export function clusterConfig(
  clusterName: string,
  routePort: number,
  peerRoutePorts: readonly number[],
  routePassword?: string,
): string {
  const login = routePassword ? `route:${encodeURIComponent(routePassword)}@` : "";
  const routes = peerRoutePorts.map((port) => JSON.stringify(`nats-route://${login}127.0.0.1:${port}`));
  return [
    "cluster {",
    `  name: ${JSON.stringify(clusterName)}`,
    `  listen: "127.0.0.1:${routePort}"`,
    ...(routePassword ? [`  authorization { user: "route", password: ${JSON.stringify(routePassword)} }`] : []),
    `  routes: [${routes.join(", ")}]`,
    // A cut route is noticed in ~3 s, not the default 2 min x 2: until then the other nodes
    // route queue requests to the cut node's subscribers and each waits out its timeout.
    '  ping_interval: "1s"',
    "  ping_max: 3",
    "}",
  ].join("\n");
}

/**
 * Starts every node and waits until each listens for clients and routes. Ports picked here
 * can be taken by another process before the server binds them: then the whole cluster is
 * started again on fresh ports (up to three times).
 */
export async function startNatsCluster(options: NatsClusterOptions): Promise<NatsCluster> {
  const picked = options.names.some((_, i) => !options.clientPorts?.[i] || !options.routePorts?.[i]);
  for (let attempt = 1; ; attempt++) {
    try {
      return await startNatsClusterOnce(options);
    } catch (err) {
      if (!picked || attempt >= 3) throw err;
    }
  }
}

async function startNatsClusterOnce(options: NatsClusterOptions): Promise<NatsCluster> {
  const ports = await fixPorts(options.names.length, options.clientPorts);
  const routePorts = await fixPorts(options.names.length, options.routePorts);
  // Shared by this cluster's nodes only, kept in their 0600 config files.
  const routePassword = randomBytes(24).toString("base64url");
  const nodes = options.names.map((name, i) =>
    natsNode({
      name,
      port: ports[i],
      routePort: routePorts[i],
      storeDir: join(options.baseDir, name),
      extraConfig: clusterConfig(
        options.clusterName,
        routePorts[i],
        routePorts.filter((_, j) => j !== i),
        routePassword,
      ),
      authorization: options.authorization,
      binary: options.binary,
      sync: options.sync,
    }),
  );
  const cluster: NatsCluster = {
    nodes,
    url: nodes.map((n) => n.url).join(","),
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
  try {
    await Promise.all(nodes.map((n) => n.start()));
  } catch (err) {
    await cluster.stop();
    throw err;
  }
  return cluster;
}

interface NodeSpec {
  name: string;
  port: number;
  routePort: number;
  storeDir: string;
  extraConfig: string;
  authorization?: string;
  binary?: string;
  sync?: string;
}

function natsNode(spec: NodeSpec): NatsNode {
  let server: NatsServer | undefined;
  return {
    name: spec.name,
    url: `nats://127.0.0.1:${spec.port}`,
    port: spec.port,
    routePort: spec.routePort,
    storeDir: spec.storeDir,
    get server() {
      return server;
    },
    async start() {
      if (server && server.process.exitCode === null && server.process.signalCode === null) return;
      server = await startNatsServer({
        storeDir: spec.storeDir,
        port: spec.port,
        serverName: spec.name,
        extraConfig: spec.extraConfig,
        authorization: spec.authorization,
        binary: spec.binary,
        sync: spec.sync,
        awaitRoutes: true,
        monitor: true,
      });
    },
    async kill() {
      const child = server?.process;
      server = undefined;
      if (!child || child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, "exit");
      child.kill("SIGKILL"); // not stop(0): a SIGTERM first would let it hand over its leaderships
      await exited;
    },
    async stop(graceMs = 5_000) {
      await server?.stop(graceMs);
      server = undefined;
    },
  };
}

async function fixPorts(count: number, wanted: readonly number[] = []): Promise<number[]> {
  const ports: number[] = [];
  for (let i = 0; i < count; i++) ports.push(wanted[i] || (await freePort()));
  return ports;
}

/**
 * The running nodes that the JetStream meta leader does not count as peers, from the leader's
 * `/jsz`; undefined while no node reports itself as the leader.
 */
export async function metaGroupOutsiders(cluster: NatsCluster): Promise<NatsNode[] | undefined> {
  for (const node of cluster.nodes) {
    const url = node.server?.monitorUrl;
    if (!url) continue;
    let meta: { leader?: string; replicas?: { name: string }[] } | undefined;
    try {
      const response = await fetch(`${url}/jsz`, { signal: AbortSignal.timeout(2_000) });
      meta = ((await response.json()) as { meta_cluster?: typeof meta }).meta_cluster;
    } catch {
      continue; // stopped or busy: ask the next node
    }
    if (meta?.leader !== node.name) continue;
    const members = new Set([node.name, ...(meta.replicas ?? []).map((r) => r.name)]);
    return cluster.nodes.filter((n) => n.server && !members.has(n.name));
  }
  return undefined;
}

/**
 * An `onNoPeers` for `waitForJetStream`. Seen on nats-server 2.10 with three nodes started at
 * once: the meta leader's group is sized 2 and the third node is never added, so R3 buckets are
 * refused ("no suitable peers for placement") until that node restarts. This restarts the nodes
 * the leader does not count as peers; with no leader to ask (or every node counted), one node
 * per call, in turn. Restarting a member instead would only cost the group its quorum for a
 * while. `onRestart` hears of each restart (the node has a new pid).
 */
export function restartStuckNodes(
  cluster: NatsCluster,
  onRestart?: (node: NatsNode, why: string) => void,
): () => Promise<void> {
  let next = cluster.nodes.length - 1;
  return async () => {
    const outsiders = await metaGroupOutsiders(cluster);
    let nodes: readonly NatsNode[];
    let why: string;
    if (outsiders?.length) {
      nodes = outsiders;
      why = "outside the JetStream meta group";
    } else {
      nodes = [cluster.nodes[next]!];
      next = (next + cluster.nodes.length - 1) % cluster.nodes.length;
      why = outsiders ? "every node a meta group peer, restarted in turn" : "no meta leader, restarted in turn";
    }
    for (const node of nodes) {
      await node.stop();
      await node.start();
      onRestart?.(node, why);
    }
  };
}

export interface JetStreamWaitOptions {
  /** Replicas of the service's buckets (3 on a 3-node cluster). */
  readonly replicas: number;
  readonly timeoutMs?: number;
  /** The roles' credentials: each creates its own buckets. */
  readonly credentials?: Partial<Record<NatsRole, NatsCredentials>>;
  /**
   * Called each time JetStream has answered "temporarily unavailable" (no meta leader) or
   * refused buckets for want of peers for `STUCK_MS`: with nodes started at the same moment,
   * one can stay outside the meta group until it restarts (seen on 2.10). The cluster runners
   * pass `restartStuckNodes`.
   */
  readonly onNoPeers?: () => Promise<void>;
}

/** How long either symptom may last before `onNoPeers` is called. */
const STUCK_MS = 8_000;

/**
 * Waits until the cluster has a JetStream meta leader (the account info request answers; a
 * request sent before that gets no answer at all, hence the short timeout), then creates the
 * service's KV buckets with `replicas` (the services bind to them). Returns the wait in ms.
 */
export async function waitForJetStream(servers: string, options: JetStreamWaitOptions): Promise<number> {
  const started = Date.now();
  // Room for two rounds of `onNoPeers` and the elections after them, on a busy machine.
  const timeoutMs = options.timeoutMs ?? 60_000;
  const as = (role: NatsRole) =>
    connect({
      servers: servers.split(","),
      name: `cluster:wait-jetstream:${role}`,
      maxReconnectAttempts: -1,
      ...authOptions(options.credentials?.[role]),
    });
  const nc = await as("actors");
  const host = await as("microvms");
  const retry = async (step: () => Promise<void>) => {
    for (;;) {
      try {
        return await step();
      } catch (err) {
        if (Date.now() - started > timeoutMs) {
          throw new Error(`JetStream cluster not ready after ${timeoutMs} ms: ${(err as Error).message}`, {
            cause: err,
          });
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  };
  try {
    // Either symptom of a node left outside the meta group: no meta leader, or no peers for R3.
    let stuckSince: number | undefined;
    const unstick = async (err: unknown) => {
      if (!/no suitable peers|temporarily unavailable/i.test((err as Error).message) || !options.onNoPeers) throw err;
      stuckSince ??= Date.now();
      if (Date.now() - stuckSince >= STUCK_MS) {
        stuckSince = undefined;
        await options.onNoPeers();
      }
      throw err;
    };
    await retry(async () => {
      const reply = await nc.request("$JS.API.INFO", "", { timeout: 1_000 });
      const error = reply.json<{ error?: { description: string } }>().error;
      if (error) await unstick(new Error(error.description));
    });
    stuckSince = undefined;
    await retry(() =>
      openBuckets(nc, { replicas: options.replicas, only: actorBuckets }).then(() => undefined, unstick),
    );
    await retry(async () => void (await openBuckets(host, { replicas: options.replicas, only: ["microvms"] })));
    return Date.now() - started;
  } finally {
    await Promise.all([nc.close(), host.close()]);
  }
}

/** The server name of a bucket's stream leader; undefined while it has none. */
async function leaderOf(kvm: Kvm, bucket: string): Promise<string | undefined> {
  return (await (await kvm.open(bucket)).status()).streamInfo.cluster?.leader;
}

/** The server name of a KV bucket's stream leader (to kill the node that hurts most). */
export async function bucketLeader(
  servers: string,
  bucket: string,
  credentials?: NatsCredentials,
): Promise<string | undefined> {
  const nc = await connect({ servers: servers.split(","), name: "cluster:leader", ...authOptions(credentials) });
  try {
    return await leaderOf(new Kvm(nc), bucket);
  } finally {
    await nc.close();
  }
}

/**
 * After the node `gone` was killed at `since`: polls (every 100 ms, through the nodes left) until
 * each bucket's stream has a leader other than `gone`, and returns the milliseconds since `since`.
 * nats-server's Raft followers wait 4-9 s for a lost leader before they campaign, and a split
 * vote costs another round: this is JetStream's part of an outage, not the service's.
 */
export async function leadersBack(
  servers: string,
  buckets: readonly string[],
  gone: string,
  credentials: NatsCredentials,
  since: number,
  timeoutMs = 60_000,
): Promise<number> {
  const nc = await connect({ servers: servers.split(","), name: "cluster:leaders", ...authOptions(credentials) });
  try {
    // A short timeout: a leaderless stream does not answer its info request.
    const kvm = new Kvm(jetstream(nc, { timeout: 500 }));
    const led = async (bucket: string) => {
      const leader = await leaderOf(kvm, bucket).catch(() => undefined); // not answering yet
      return leader !== undefined && leader !== gone;
    };
    for (;;) {
      if ((await Promise.all(buckets.map(led))).every(Boolean)) return Date.now() - since;
      if (Date.now() - since > timeoutMs)
        throw new Error(`${buckets.join(", ")}: no leader ${timeoutMs} ms after the kill`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await nc.close();
  }
}

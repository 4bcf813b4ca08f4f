// A JetStream cluster of local `nats-server` processes on loopback: one store directory,
// client port and route port per node, full-mesh routes, and a wait for a meta leader.
import { once } from "node:events";
import { join } from "node:path";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { randomBytes } from "node:crypto";
import { connect } from "@nats-io/transport-node";
import {
  actorBuckets,
  authOptions,
  freePort,
  provisionBuckets,
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
  // Every start settled before the stop: a node still starting when another failed would
  // otherwise be left running (on the same store as the next attempt's node).
  const failed = (await Promise.allSettled(nodes.map((n) => n.start()))).find((r) => r.status === "rejected");
  if (failed) {
    await cluster.stop();
    throw failed.reason;
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

export interface JetStreamWaitOptions {
  /** Replicas of the service's buckets (3 on a 3-node cluster). */
  readonly replicas: number;
  readonly timeoutMs?: number;
  /** The roles' credentials: `provision` creates the buckets. */
  readonly credentials?: Partial<Record<NatsRole, NatsCredentials>>;
}

/**
 * Waits until the cluster has a JetStream meta leader (the account info request answers; a
 * request sent before that gets no answer at all, hence the short timeout), then creates the
 * service's KV buckets with `replicas` (the services bind to them). Returns the wait in ms.
 */
export async function waitForJetStream(servers: string, options: JetStreamWaitOptions): Promise<number> {
  const started = Date.now();
  // Elections take seconds, more on a busy machine (and where two nodes' first routes collide).
  const timeoutMs = options.timeoutMs ?? 60_000;
  const as = (role: NatsRole) =>
    connect({
      servers: servers.split(","),
      name: `cluster:wait-jetstream:${role}`,
      maxReconnectAttempts: -1,
      ...authOptions(options.credentials?.[role]),
    });
  const nc = await as("provision");
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
    // Until the meta leader is elected JetStream answers "temporarily unavailable"; until every
    // node is a meta group peer, R3 buckets are refused ("no suitable peers"): both retried.
    await retry(async () => {
      const reply = await nc.request("$JS.API.INFO", "", { timeout: 1_000 });
      const error = reply.json<{ error?: { description: string } }>().error;
      if (error) throw new Error(error.description);
    });
    await retry(
      async () =>
        void (await provisionBuckets(nc, { replicas: options.replicas, only: [...actorBuckets, "microvms"] })),
    );
    return Date.now() - started;
  } finally {
    await nc.close();
  }
}

/** The server name of a bucket's stream leader; undefined while it has none. */
async function leaderOf(kvm: Kvm, bucket: string): Promise<string | undefined> {
  return (await clusterOf(kvm, bucket))?.leader;
}

/** A bucket's stream's cluster info (its leader and replicas), as the leader answers it. */
async function clusterOf(kvm: Kvm, bucket: string) {
  return (await (await kvm.open(bucket)).status()).streamInfo.cluster;
}

/**
 * A bucket's replicas as its stream leader reports them, for a test's report: the leader
 * (`name*`), then each peer as `name` (current), `name~lag` (that many entries behind) or
 * `name!` (offline); or `no leader`. `lag` is the largest follower's (Infinity: no leader, or
 * one offline).
 */
async function replicaState(kvm: Kvm, bucket: string): Promise<{ line: string; lag: number }> {
  const cluster = await clusterOf(kvm, bucket).catch(() => undefined);
  if (!cluster?.leader) return { line: "no leader", lag: Number.POSITIVE_INFINITY };
  const peers = (cluster.replicas ?? []).map((r) =>
    r.offline
      ? { label: `${r.name}!`, lag: Number.POSITIVE_INFINITY }
      : r.current
        ? { label: r.name, lag: 0 }
        : { label: `${r.name}~${r.lag ?? "?"}`, lag: r.lag ?? Number.POSITIVE_INFINITY },
  );
  return {
    line: [`${cluster.leader}*`, ...peers.map((p) => p.label)].join(" "),
    lag: Math.max(0, ...peers.map((p) => p.lag)),
  };
}

/**
 * Waits until every bucket has a leader and each of its other replicas is online and at most
 * `inFlight` entries behind it (the writes a steady load can have under way at once; a node
 * catching up after a cut or a restart is thousands behind): a node that rejoined is a whole
 * peer again, so losing another one next is a single fault, not a second. Resolves to the ms
 * it waited and each bucket's replicas as first seen (`replicaState`'s line).
 */
export async function replicasCurrent(
  servers: string,
  buckets: readonly string[],
  options: { credentials?: NatsCredentials; inFlight?: number; timeoutMs?: number } = {},
): Promise<{ waitedMs: number; first: Record<string, string> }> {
  const { credentials, inFlight = 0, timeoutMs = 60_000 } = options;
  const started = Date.now();
  const nc = await connect({ servers: servers.split(","), name: "cluster:replicas", ...authOptions(credentials) });
  try {
    const kvm = new Kvm(jetstream(nc, { timeout: 500 }));
    const lines = (states: { line: string }[]) => Object.fromEntries(buckets.map((b, i) => [b, states[i]!.line]));
    let first: Record<string, string> | undefined;
    for (;;) {
      const states = await Promise.all(buckets.map((bucket) => replicaState(kvm, bucket)));
      first ??= lines(states);
      if (states.every((s) => s.lag <= inFlight)) return { waitedMs: Date.now() - started, first };
      if (Date.now() - started > timeoutMs)
        throw new Error(`replicas not caught up ${timeoutMs} ms on: ${JSON.stringify(lines(states))}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await nc.close();
  }
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
  /** Other streams the work needs (the list indexes: `INDEX_<bucket>`), by stream name. */
  streams: readonly string[] = [],
): Promise<number> {
  const nc = await connect({ servers: servers.split(","), name: "cluster:leaders", ...authOptions(credentials) });
  try {
    // A short timeout: a leaderless stream does not answer its info request.
    const kvm = new Kvm(jetstream(nc, { timeout: 500 }));
    const jsm = await jetstreamManager(nc, { timeout: 500, checkAPI: false });
    const isLed = (leader: string | undefined) => leader !== undefined && leader !== gone;
    const led = async (bucket: string) => isLed(await leaderOf(kvm, bucket).catch(() => undefined)); // not answering yet
    const streamLed = async (stream: string) =>
      isLed(
        await jsm.streams.info(stream).then(
          (info) => info.cluster?.leader,
          () => undefined,
        ),
      );
    for (;;) {
      const all = await Promise.all([...buckets.map(led), ...streams.map(streamLed)]);
      if (all.every(Boolean)) return Date.now() - since;
      if (Date.now() - since > timeoutMs)
        throw new Error(`${[...buckets, ...streams].join(", ")}: no leader ${timeoutMs} ms after the kill`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await nc.close();
  }
}

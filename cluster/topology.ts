// The scale-out topology, described once: three JetStream nodes, two gateways, two actor
// processes and a microVM host with R3 buckets. `npm run cluster` starts it as local
// processes; compose.yaml is the same shape in containers (test/cluster.test.ts checks both).
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import {
  authDirOf,
  authorizationConfig,
  ensureNatsCredentials,
  type NatsCredentials,
  type NatsRole,
} from "../platform/index.ts";
import { startNatsCluster, waitForJetStream, type NatsCluster } from "./nats-cluster.ts";
import { startRole, type GatewayPorts, type Role, type RoleProcess } from "./roles.ts";

export interface GatewaySpec {
  readonly name: string;
  /** Task, Job and microVM API ports (0: a free port each). */
  readonly ports: GatewayPorts;
}

export interface Topology {
  readonly clusterName: string;
  /** NATS node names, client ports and route ports (0: a free port). */
  readonly nats: readonly { readonly name: string; readonly port: number; readonly routePort: number }[];
  readonly gateways: readonly GatewaySpec[];
  readonly actors: readonly string[];
  readonly microvmHosts: readonly string[];
  /** JetStream replicas of every KV bucket (KV_REPLICAS). */
  readonly replicas: number;
}

/** Ports a gateway listens on from its base port: task, job, microVM API = base, +1, +2. */
export const gatewayPorts = (base: number): GatewayPorts =>
  base === 0 ? { task: 0, job: 0, microvm: 0 } : { task: base, job: base + 1, microvm: base + 2 };

export const defaultTopology: Topology = {
  clusterName: "typed-service",
  nats: [
    { name: "nats-1", port: 14222, routePort: 16222 },
    { name: "nats-2", port: 14223, routePort: 16223 },
    { name: "nats-3", port: 14224, routePort: 16224 },
  ],
  gateways: [
    { name: "gateway-1", ports: gatewayPorts(8787) },
    { name: "gateway-2", ports: gatewayPorts(9787) },
  ],
  actors: ["actors-1", "actors-2"],
  microvmHosts: ["microvm-host-1"],
  replicas: 3,
};

/**
 * The default topology with ports from the environment: CLUSTER_NATS_PORTS and
 * CLUSTER_ROUTE_PORTS (one per node, comma-separated), CLUSTER_GATEWAY_PORTS (one base port
 * per gateway). A 0 picks a free port.
 */
export function topologyFromEnv(env: NodeJS.ProcessEnv, base: Topology = defaultTopology): Topology {
  const natsPorts = portList(env, "CLUSTER_NATS_PORTS", base.nats.length);
  const routePorts = portList(env, "CLUSTER_ROUTE_PORTS", base.nats.length);
  const gatewayBases = portList(env, "CLUSTER_GATEWAY_PORTS", base.gateways.length);
  return {
    ...base,
    nats: base.nats.map((node, i) => ({
      ...node,
      port: natsPorts?.[i] ?? node.port,
      routePort: routePorts?.[i] ?? node.routePort,
    })),
    gateways: base.gateways.map((g, i) => (gatewayBases ? { ...g, ports: gatewayPorts(gatewayBases[i]) } : g)),
  };
}

function portList(env: NodeJS.ProcessEnv, name: string, count: number): number[] | undefined {
  const raw = env[name];
  if (!raw) return undefined;
  const ports = raw.split(",").map((p) => Number(p.trim()));
  if (ports.length !== count || ports.some((p) => !Number.isInteger(p) || p < 0 || p > 65_535)) {
    throw new Error(`${name} must list ${count} ports separated by commas, got "${raw}"`);
  }
  return ports;
}

export interface StartClusterOptions {
  /** NATS stores and each process's DATA_DIR go under it. */
  readonly baseDir: string;
  /** Each output line of a service process. */
  readonly onLine?: (name: string, line: string) => void;
  /** Extra env for every service process. */
  readonly env?: Readonly<Record<string, string>>;
  /** Runs the NATS nodes with this binary instead of the one `natsServerPath()` finds. */
  readonly natsBinary?: string;
  /** Called with the pid of each process as it is spawned (to record it before anything can fail). */
  readonly onStarted?: (pid: number) => void;
}

export interface RunningCluster {
  readonly topology: Topology;
  /** The generated per-role NATS credentials (also in `<baseDir>/nats-auth`, the roles' NATS_AUTH_DIR). */
  readonly credentials: Record<NatsRole, NatsCredentials>;
  readonly nats: NatsCluster;
  readonly gateways: readonly RoleProcess[];
  readonly services: readonly RoleProcess[];
  /** How long the cluster took to have a JetStream meta leader. */
  readonly jetStreamReadyMs: number;
  /** Gateways first, then actors and hosts, then NATS: nothing is left running. */
  stop(): Promise<void>;
}

export async function startCluster(topology: Topology, options: StartClusterOptions): Promise<RunningCluster> {
  await mkdir(options.baseDir, { recursive: true });
  const services: RoleProcess[] = [];
  // No anonymous clients: one generated nkey user per role, as `npm start` does.
  const authDir = authDirOf(options.baseDir);
  const credentials = await ensureNatsCredentials(authDir);
  const nats = await startNatsCluster({
    authorization: authorizationConfig(
      credentials,
      (options.env?.NATS_SUBJECT_PREFIX ?? process.env.NATS_SUBJECT_PREFIX) || "",
    ),
    baseDir: options.baseDir,
    names: topology.nats.map((n) => n.name),
    clientPorts: topology.nats.map((n) => n.port),
    routePorts: topology.nats.map((n) => n.routePort),
    clusterName: topology.clusterName,
    binary: options.natsBinary,
  });
  for (const node of nats.nodes) options.onStarted?.(node.server!.pid);
  const stop = async () => {
    const byRole = (role: Role) => services.filter((s) => s.role === role);
    await Promise.all(byRole("gateway").map((s) => s.stop()));
    await Promise.all([...byRole("actors"), ...byRole("microvms")].map((s) => s.stop()));
    await nats.stop();
  };
  try {
    const jetStreamReadyMs = await waitForJetStream(nats.url, {
      replicas: topology.replicas,
      credentials,
    });
    const common = { natsUrl: nats.url, runDir: options.baseDir, onLine: options.onLine };
    const env = { ...options.env, KV_REPLICAS: String(topology.replicas), NATS_AUTH_DIR: authDir };
    const start = async (name: string, role: Role, roleEnv: Record<string, string> = {}) => {
      const proc = await startRole({
        ...common,
        name,
        role,
        dataDir: join(options.baseDir, name),
        env: { ...env, ...roleEnv },
        onSpawn: options.onStarted,
      });
      services.push(proc);
    };
    const started = await Promise.allSettled([
      ...topology.gateways.map((g) =>
        start(g.name, "gateway", {
          TASK_API_PORT: String(g.ports.task),
          JOB_API_PORT: String(g.ports.job),
          MICROVM_API_PORT: String(g.ports.microvm),
        }),
      ),
      ...topology.actors.map((name) => start(name, "actors")),
      ...topology.microvmHosts.map((name) => start(name, "microvms", { MICROVM_HOST_ID: name })),
    ]);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) throw failed.reason;
    const gateways = topology.gateways.map((g) => services.find((s) => s.name === g.name)!);
    return { topology, credentials, nats, gateways, services, jetStreamReadyMs, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

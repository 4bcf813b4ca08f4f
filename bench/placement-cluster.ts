// One configuration of the placement bench as a running system: the 3-node R3 cluster with one
// gateway and the given actor processes (cluster/topology.ts), plus the bench's own NATS
// connection and task client. `stop()` stops every process and removes the cluster's directory.
import { rm } from "node:fs/promises";
import {
  belongsTo,
  defaultTopology,
  gatewayPorts,
  signal,
  startCluster,
  type RunningCluster,
  type Topology,
} from "../cluster/index.ts";
import { connectNats, type NatsHandle } from "../platform/index.ts";
import { exitedChildren, once } from "./children.ts";
import { isProblem } from "./stacks.ts";
import type { ProcessGroups } from "./types.ts";
import { benchTaskClient, type Routing, type TaskClient } from "./placement-client.ts";

export interface BenchCluster {
  readonly client: TaskClient;
  /** Each actor process on its own, the gateway, and the three NATS nodes together. */
  groups(): ProcessGroups;
  /** Processes of this cluster that have exited (a crash mid-round explains its errors). */
  deaths(): string[];
  /** Warning and error lines the services logged so far (the last few, and how many). */
  warnings(): { count: number; last: string[] };
  stop(): Promise<void>;
}

/** The test topology of test/cluster.test.ts: three NATS nodes on free ports, one gateway, no microVM host. */
export function benchTopology(actors: readonly string[]): Topology {
  return {
    ...defaultTopology,
    nats: defaultTopology.nats.map((n) => ({ ...n, port: 0, routePort: 0 })),
    gateways: [{ name: "gateway-1", ports: gatewayPorts(0) }],
    actors,
    microvmHosts: [],
    replicas: 3,
  };
}

/** Every pid any cluster of this run spawned, with its directory: SIGKILLed on exit if still ours. */
const spawned = new Map<number, string>();
process.on("exit", () => {
  for (const [pid, dir] of spawned) if (belongsTo(pid, dir)) signal(pid, "SIGKILL");
});

export async function startBenchCluster(
  actors: readonly string[],
  baseDir: string,
  routing: Routing = "owner",
): Promise<BenchCluster> {
  const warnings = { count: 0, last: [] as string[] };
  const onLine = (name: string, line: string) => {
    if (!isProblem(line)) return;
    warnings.count++;
    warnings.last.push(`${name}: ${line.slice(0, 300)}`);
    if (warnings.last.length > 5) warnings.last.shift();
  };
  let cluster: RunningCluster | undefined;
  let nats: NatsHandle | undefined;
  // Once: the round's own clean-up and a Ctrl-C may both ask.
  const stop = once(async () => {
    await nats?.close().catch(() => {});
    await cluster?.stop();
    await rm(baseDir, { recursive: true, force: true });
  });
  try {
    cluster = await startCluster(benchTopology(actors), {
      baseDir,
      env: { READ_CACHE_ENTRIES: "0" },
      onLine,
      onStarted: (pid) => spawned.set(pid, baseDir),
    });
    nats = await connectNats({
      servers: cluster.nats.url,
      name: "bench:placement",
      credentials: cluster.credentials.gateway,
    });
  } catch (err) {
    await stop();
    throw err;
  }
  const running = cluster;
  const actorProcs = running.services.filter((s) => s.role === "actors");
  const gateway = running.gateways[0]!;
  return {
    client: benchTaskClient(nats, routing, running.topology.replicas ?? 1),
    groups: () => ({
      ...Object.fromEntries(actorProcs.map((s) => [s.name, [s.pid]])),
      gateway: [gateway.pid],
      nats: running.nats.nodes.flatMap((n) => (n.server ? [n.server.process.pid!] : [])),
    }),
    deaths: () => [
      ...exitedChildren(running.services.map((s) => ({ ...s, process: s.child }))),
      ...running.nats.nodes
        .filter((n) => !n.server || n.server.process.exitCode !== null || n.server.process.signalCode !== null)
        .map((n) => `${n.name} exited`),
    ],
    warnings: () => ({ count: warnings.count, last: [...warnings.last] }),
    stop,
  };
}

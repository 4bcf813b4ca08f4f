// The cluster the fault tests run: three NATS nodes on picked ports, two gateways and three
// actor processes, every activation line of theirs collected (with writes) for the overlap checks.
import { jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import type { ActivationEvent } from "../../actors/index.ts";
import { defaultTopology, gatewayPorts, type Topology } from "../../cluster/index.ts";
import { authOptions, type NatsCredentials } from "../../platform/index.ts";

export const faultTopology: Topology = {
  ...defaultTopology,
  nats: defaultTopology.nats.map((n) => ({ ...n, port: 0, routePort: 0 })),
  gateways: [
    { name: "gateway-1", ports: gatewayPorts(0) },
    { name: "gateway-2", ports: gatewayPorts(0) },
  ],
  actors: ["actors-1", "actors-2", "actors-3"],
  microvmHosts: [],
};

/** Activation lines are debug records; writes are logged only with TASK_OBJECT_LOG_WRITES. */
export const activationLogEnv = { TASK_OBJECT_LOG_WRITES: "1", LOG_LEVEL: "debug" };

export interface ActivationLog {
  readonly events: (ActivationEvent & { process: string })[];
  /** Lease owner id → the name of the process it belongs to. */
  readonly processOf: Map<string, string>;
  /** Pass as `startCluster`'s `onLine`. */
  onLine(process: string, line: string): void;
}

export function activationLog(): ActivationLog {
  const events: (ActivationEvent & { process: string })[] = [];
  const processOf = new Map<string, string>();
  return {
    events,
    processOf,
    onLine(process, line) {
      if (!line.includes('"activation"')) return;
      const event = (JSON.parse(line) as { activation: ActivationEvent }).activation;
      processOf.set(event.owner, process);
      events.push({ ...event, process });
    },
  };
}

/**
 * After the NATS node `gone` was killed at `since`: polls (every 100 ms, through the nodes left)
 * until each bucket's stream has a leader other than `gone`, and returns the milliseconds since
 * `since`. nats-server's Raft followers wait 4-9 s for a lost leader before they campaign, and a
 * split vote costs another round: this is JetStream's part of an outage, not the service's.
 */
export async function leadersBack(
  servers: string,
  buckets: readonly string[],
  gone: string,
  credentials: NatsCredentials,
  since: number,
  timeoutMs = 60_000,
): Promise<number> {
  const nc = await connect({ servers: servers.split(","), name: "test:leaders", ...authOptions(credentials) });
  try {
    const kvm = new Kvm(jetstream(nc, { timeout: 500 }));
    const led = async (bucket: string) => {
      const leader = await kvm
        .open(bucket)
        .then((kv) => kv.status())
        .then((status) => status.streamInfo.cluster?.leader)
        .catch(() => undefined);
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

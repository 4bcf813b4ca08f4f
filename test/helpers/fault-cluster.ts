// The cluster the fault tests run: three NATS nodes on picked ports, two gateways and three
// actor processes, every activation line of theirs collected (with writes) for the overlap checks.
import { appendFileSync } from "node:fs";
import type { ActivationEvent } from "../../actors/index.ts";
import { defaultTopology, gatewayPorts, type Topology } from "../../cluster/index.ts";

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

/** Every line of every process goes here too, for a look at a failed run (`FAULT_LOG=<file>`). */
const faultLog = process.env.FAULT_LOG;

export function activationLog(): ActivationLog {
  const events: (ActivationEvent & { process: string })[] = [];
  const processOf = new Map<string, string>();
  return {
    events,
    processOf,
    onLine(name, line) {
      if (faultLog) appendFileSync(faultLog, `${name} ${line}\n`);
      if (!line.includes('"activation"')) return;
      const event = (JSON.parse(line) as { activation: ActivationEvent }).activation;
      processOf.set(event.owner, name);
      events.push({ ...event, process: name });
    },
  };
}

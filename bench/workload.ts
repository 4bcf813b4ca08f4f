// What a workload is: the context it is prepared in and what it returns (types only, shared by
// workloads.ts and crud-workloads.ts).
import type { Environment, ServiceGroup } from "./environment.ts";
import type { Runner } from "./runners.ts";
import type { Seeds } from "./seed.ts";

/** The environment's URLs and connection (the :always, :r3 and :noauth stacks' too), and the seeded records. */
export interface WorkloadContext
  extends Pick<
    Environment,
    "taskUrl" | "jobUrl" | "bareUrl" | "always" | "r3" | "noAuthTaskUrl" | "traced" | "nc" | "anchorUrl" | "lists"
  > {
  /** The records of the auth-off service, and of the main one. */
  noAuthSeeds: Seeds;
  /** The traced stack's records, when it runs. */
  tracedSeeds?: Seeds;
  /** The no-hop anchor's tasks, when it runs. */
  anchorSeeds?: Seeds;
  seeds: Seeds;
  objectNames: string[];
  /** The same stacks on the `--nats-compare` server, when started. */
  compared?: WorkloadContext;
}

export interface Workload {
  name: string;
  summary: string;
  /** Whose RSS and CPU count as "service" for this row. */
  serviceGroup: ServiceGroup;
  /** Runs on the `--nats-compare` stacks: their processes are the ones measured. */
  onCompared?: boolean;
  /** Runs only when named in `--only` (it seeds what it consumes: slow). */
  optIn?: boolean;
  prepare(ctx: WorkloadContext): Promise<Runner>;
}

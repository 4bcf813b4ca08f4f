// Command-line options of `npm run bench` and their --help text.
import { parseArgs } from "node:util";

export interface BenchOptions {
  help: boolean;
  quick: boolean;
  rounds: number;
  /** Seconds per workload per round. */
  duration: number;
  /** Seconds of unmeasured load per workload before the first round. */
  warmup: number;
  connections: number;
  /** Workload names to run (the baseline always runs); undefined: all. */
  only?: string[];
  /** Records of each kind seeded for the read workloads. */
  seedCount: number;
  splitRoles: boolean;
  cpuProf?: string;
  /** Extra node flags for the service processes (e.g. V8 heap flags to compare). */
  nodeFlags: string[];
  growth: boolean;
  growthSize: number;
  /** The microVM bench instead (bench/microvm.ts). */
  microvm: boolean;
  /** The node-flag experiment on hand-started instance runtimes (bench/microvm-flags.ts). */
  microvmFlags: boolean;
  /** A burst of launches at once, with and without boot slots (bench/microvm-burst.ts). */
  microvmBurst: boolean;
  /** Launches per burst. */
  burst: number;
  /** Only the image rows of the microVM bench, on the sandbox provider (bench/microvm-images.ts). */
  microvmImages: boolean;
  /** Only the snapshot rows of the microVM bench, on the gvisor provider (bench/microvm-snapshots.ts). */
  microvmSnapshots: boolean;
  /** Only the default run's launch and memory rows (gVisor). */
  microvmLaunches: boolean;
  /** The default run without its microVM rows. */
  noMicrovm: boolean;
  /** The CLI start-up bench instead (bench/cli-start.ts). */
  cli: boolean;
  /** The task-object throughput bench on the 3-node cluster, 1 vs 2 actor processes (bench/placement.ts). */
  placement: boolean;
  /** Task-object names the placement bench spreads its load over. */
  placementNames: number;
  /** Send task-object requests through the shared subject only (no owner routing). */
  placementShared: boolean;
  /** Measure the baseline again right before each workload, for its ratio (slower, steadier). */
  pairBaseline: boolean;
  /** HTTP load generator; undefined: wrk when installed, else autocannon. */
  driver?: "wrk" | "autocannon";
  /** Another nats-server binary: the service's stacks again on it, each row beside its twin. */
  natsCompare?: string;
  /** Another checkout of this service: its stacks again running that main.ts, each row beside its twin. */
  serviceCompare?: string;
  /** Another checkout of this service whose main.ts the rows without a twin label run. */
  serviceCheckout?: string;
}

/** One bench of `npm run bench`: the run's header (command, machine, options) goes into its results file. */
export type BenchRun = (options: BenchOptions, header: Record<string, unknown>, startedAt: Date) => Promise<void>;

export const helpText = `Usage: npm run bench -- [options]

Starts a private nats-server, the service (main.ts) and a bare node:http server as child
processes, loads each workload with wrk (when installed; else autocannon) over HTTP or with
direct NATS requests, and prints
the median over rounds. Then, once those stacks are gone, the microVM rows (gVisor, where runsc
runs): 10 suspend/resume cycles against the cold launch beside each (--quick 5), the bytes a
snapshot stores, 10 instances suspended together, launches with and without a wall booted
ahead, 10 at once (with one wall and with 10 booted ahead), the memory per idle instance
(its cgroup's charge and parts), the object rows (a call to an
active object, an activation, storage operations and alarms per second), and the targets' verdicts.
Results go to bench/results/<timestamp>.json and latest.json.

Options:
  --quick              2 s per workload, 1 round, short warm-up
  --rounds N           rounds; each runs the baseline then every workload (default 3)
  --duration S         seconds per workload per round (default 5)
  --warmup S           unmeasured seconds per workload before round 1 (default 1; quick 0.5)
  --connections N      HTTP connections / NATS requests in flight (default 50)
  --only a,b,...       only these workloads (the bare node:http baseline always runs):
                       createTask, getTask, getTaskMissing, createTaskDO,
                       createTaskDO:hot (all on one name), getTaskDO,
                       updateTask, updateTaskDO, listTasksDO (a page of 100), getTaskObject,
                       listTasks:1k, listTasks:100k, listTasksDO:1k, listTasksDO:100k,
                       listTaskObjects:1k, listTaskObjects:100k, getTaskObject:1k,
                       getTaskObject:100k (pages of 100 at random places, one request at a
                       time, on two stacks of their own seeded with 1,000 / 100,000 records),
                       and only when named here: deleteTask, deleteTaskDO (see below),
                       createJob, createTask:always, createJob:always, getJob,
                       createTask:r3, createJob:r3, createTask:r3:always, createJob:r3:always,
                       nats:createTask, nats:getTask, createTask:noauth, getTask:noauth,
                       createTask:traced, getTask:traced
                       (the :always ones run against a second nats-server with
                       NATS_SYNC=always; the :r3 ones against services on two 3-node
                       clusters with R3 buckets, NATS_SYNC 1s and always, started only
                       when an :r3 row runs; the :noauth ones against the same service with
                       NATS auth off; the :traced ones against the same service with
                       OTEL_EXPORTER_OTLP_ENDPOINT set, spans exported to a sink in the
                       bench, sampled as OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
                       say (default: every request); the others' has NATS_SYNC as set, else 1s, e.g.
                       NATS_SYNC=2m for nats-server's own default).
                       In deleteTask and deleteTaskDO each DELETE removes
                       a task created for it before the load, unmeasured (every answer a
                       204); topping up that pool takes about as long as the load itself.
                       anchor:createTask, anchor:getTask, anchor:getTaskMissing: the same
                       three on the no-hop anchor, a polka server writing straight to JetStream
                       KV (kv.create, kv.get; no actor, no cache) in its own bucket on the
                       service's nats-server with a login of its own, started only when an
                       anchor: row runs. The service's stack runs as npm start runs it: the
                       nats-server npm start finds (NATS_SERVER_BIN, .tools/, PATH), one nkey
                       user per role, NATS_SYNC as set, else 1s.
  --pair-baseline      measure the baseline again right before each workload and take each
                       ratio against that one (twice the time; steadier on a shared machine)
  --nats-compare PATH  start the service's stacks (the :always and :r3 ones when asked for)
                       a second time with every nats-server running PATH, e.g. an older
                       release, and measure each row on them right after itself in every
                       round, as "<row> @v<version>" (bare, :noauth and :traced rows have no twin)
  --service-compare DIR
                       the same for the service: its stacks started a second time running
                       DIR's main.ts (another commit's checkout with its node_modules, e.g.
                       git worktree add /tmp/before <commit>), each row measured on them right
                       after itself, as "<row> @<commit>" (bare and :traced rows have no twin)
  --service-checkout DIR
                       run DIR's main.ts instead of this checkout's for the rows without "@"
                       (with --service-compare: two other commits paired in one run)
  --driver wrk|autocannon
                       HTTP load generator (default: wrk when installed, else autocannon)
  --seed N             records of each kind created for the read workloads (default 1000)
  --split-roles        run the service as two processes (--role actors, --role gateway)
  --cpu-prof DIR       run the service under node --cpu-prof, profiles written to DIR at exit
                       (summarize with: npx tsx bench/profile-summary.ts DIR/*.cpuprofile)
  --node-flags "F ..." node flags for the service processes, added to the ones npm start
                       uses (compare runs with and without, e.g. "--max-semi-space-size=8")
  --no-microvm         the default run without its microVM rows (they also skip with --only,
                       --growth and the compare options)
  --growth             growth check instead: RSS and getTask latency at 0 and 100k records
  --growth-size N      records to grow to (implies --growth; e.g. 1000000 adds a 1M point)
  --microvm            microVM bench instead, every provider (process, sandbox, and gvisor where
                       runsc runs) in one run and each wall's cost as ratios (sandbox/process,
                       gvisor/sandbox): launch → first RPC, RPC via the proxy, suspend/resume,
                       image push, memory per instance at 1/10/50 live, against issues 11, 13
                       and 23's targets, and gvisor's snapshot rows (those of --microvm-snapshots)
                       (~15 min on a loaded 2-core machine; --quick ~4 min; --cpu-prof DIR
                       profiles the services). Not in the default run.
  --microvm-burst      a burst of launches at once on one host (gvisor where runsc runs, else
                       sandbox), with the host's boot slots and without a bound, taking turns:
                       how many started within the start timeout, first / median / last ready
                       (--burst N launches, default 80; --rounds, default 3; ~4 min)
  --microvm-flags      node-flag experiment: RSS, start and RPC latency of the sandbox runtime
                       started by hand under each candidate set of node flags
  --microvm-images     only the image rows of --microvm, on the sandbox provider: createImage
                       → registered, and first RPC of an image the host has not cached vs
                       cached (9 samples; --quick 3)
  --microvm-snapshots  only the snapshot rows of --microvm, on the gvisor provider: SuspendMicrovm,
                       ResumeMicrovm → first RPC, auto-resume, bytes per snapshot, against cold
                       RunMicrovm → first RPC in the same run (10 cycles; --quick 5), what
                       50 SUSPENDED instances hold on the host against the same 50 RUNNING, and
                       launch from snapshot vs cold start: RunMicrovm → first RPC of a slow-
                       importing image (test/images/heavy-init.ts) restored from its launch
                       snapshot against cold on a second service with MICROVM_LAUNCH_SNAPSHOTS=0,
                       taking turns (10 each; --quick 5), their ratio and the snapshot's bytes
  --microvm-launches   only the default run's launch and memory rows, on gvisor: launches with a
                       wall booted ahead (10; --quick 5), 10 at once with the default pool and
                       with 10 walls booted ahead, without a wall, what an idle instance costs
  --cli                taskctl's start-up instead: median wall time of node -e 0, taskctl
                       --help, taskctl tasks get to a closed port (and the same through tsx),
                       interleaved, --rounds runs each (default 15; --quick 5)
  --placement          task-object throughput on the 3-node cluster (R3) with 1 vs 2 actor
                       processes, loaded over NATS (createTaskDO then getTaskDO per worker),
                       sent straight to each name's owner as the gateway does;
                       rounds alternate the two configurations, each on a fresh cluster
                       (--quick: 1 round of 3 s). Not part of the default run.
  --placement-names N  task-object names the load spreads over (default 200; implies --placement)
  --placement-shared   send through the shared subjects only, so non-owners forward (implies
                       --placement)
  --help               this text
`;

/** A bad command line: printed as one line with a pointer to --help, no stack. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

export function isUsageError(err: unknown): boolean {
  return err instanceof UsageError || String((err as { code?: unknown })?.code ?? "").startsWith("ERR_PARSE_ARGS");
}

function positive(name: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0) throw new UsageError(`--${name} must be a positive number, got "${raw}"`);
  return value;
}

export function parseOptions(args: string[]): BenchOptions {
  const { values } = parseArgs({
    args,
    strict: true,
    options: {
      help: { type: "boolean", short: "h" },
      quick: { type: "boolean" },
      rounds: { type: "string" },
      duration: { type: "string" },
      warmup: { type: "string" },
      connections: { type: "string" },
      only: { type: "string" },
      seed: { type: "string" },
      "split-roles": { type: "boolean" },
      "cpu-prof": { type: "string" },
      "node-flags": { type: "string" },
      growth: { type: "boolean" },
      "growth-size": { type: "string" },
      microvm: { type: "boolean" },
      "microvm-flags": { type: "boolean" },
      "microvm-burst": { type: "boolean" },
      burst: { type: "string" },
      "microvm-images": { type: "boolean" },
      "microvm-snapshots": { type: "boolean" },
      "microvm-launches": { type: "boolean" },
      "no-microvm": { type: "boolean" },
      cli: { type: "boolean" },
      placement: { type: "boolean" },
      "placement-names": { type: "string" },
      "placement-shared": { type: "boolean" },
      driver: { type: "string" },
      "pair-baseline": { type: "boolean" },
      "nats-compare": { type: "string" },
      "service-compare": { type: "string" },
      "service-checkout": { type: "string" },
    },
  });
  const quick = values.quick ?? false;
  const placement =
    (values.placement ?? false) || values["placement-names"] !== undefined || values["placement-shared"] === true;
  return {
    help: values.help ?? false,
    quick,
    rounds: Math.round(positive("rounds", values.rounds, quick ? 1 : 3)),
    // A placement round pays a whole cluster start; 2 s of load would be mostly noise.
    duration: positive("duration", values.duration, quick ? (placement ? 3 : 2) : 5),
    warmup: values.warmup === "0" ? 0 : positive("warmup", values.warmup, quick ? 0.5 : 1),
    connections: Math.round(positive("connections", values.connections, 50)),
    only: values.only
      ?.split(",")
      .map((s) => s.trim())
      .filter(Boolean),
    seedCount: Math.round(positive("seed", values.seed, 1000)),
    splitRoles: values["split-roles"] ?? false,
    cpuProf: values["cpu-prof"],
    nodeFlags: values["node-flags"]?.split(/\s+/).filter(Boolean) ?? [],
    growth: (values.growth ?? false) || values["growth-size"] !== undefined,
    growthSize: Math.round(positive("growth-size", values["growth-size"], 100_000)),
    microvm: values.microvm ?? false,
    microvmFlags: values["microvm-flags"] ?? false,
    microvmBurst: (values["microvm-burst"] ?? false) || values.burst !== undefined,
    burst: Math.round(positive("burst", values.burst, 80)),
    microvmImages: values["microvm-images"] ?? false,
    microvmSnapshots: values["microvm-snapshots"] ?? false,
    microvmLaunches: values["microvm-launches"] ?? false,
    noMicrovm: values["no-microvm"] ?? false,
    cli: values.cli ?? false,
    placement,
    placementNames: Math.round(positive("placement-names", values["placement-names"], 200)),
    placementShared: values["placement-shared"] ?? false,
    driver: driverOf(values.driver),
    pairBaseline: values["pair-baseline"] ?? false,
    natsCompare: values["nats-compare"],
    serviceCompare: values["service-compare"],
    serviceCheckout: values["service-checkout"],
  };
}

function driverOf(raw: string | undefined): BenchOptions["driver"] {
  if (raw === undefined || raw === "wrk" || raw === "autocannon") return raw;
  throw new UsageError(`--driver must be wrk or autocannon, got "${raw}"`);
}

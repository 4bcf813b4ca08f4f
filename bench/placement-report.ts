// Tables of the placement bench: one row per measured round (throughput and where the CPU went)
// and one per configuration (medians over rounds, errors summed, the 2-actor/1-actor ratio).
import type { LoadOutcome } from "./placement-load.ts";
import { count, fixed, markdownTable } from "./report.ts";
import { median } from "./stats.ts";

/** A configuration: a label and the actor processes it runs. */
export interface PlacementConfig {
  label: string;
  actors: readonly string[];
}

export interface RoundMeasurement {
  round: number;
  config: string;
  actors: readonly string[];
  /** Cluster start to ready (NATS nodes, JetStream, buckets, gateway, actors). */
  startSeconds: number;
  /** Failures while seeding (one create per name) and during the warm-up, by `<operation>:<_tag>`. */
  seedErrors: Record<string, number>;
  warmupErrors: Record<string, number>;
  load: LoadOutcome;
  /**
   * CPU seconds over the measured span: each actor process by name, `gateway`, `nats` (3 nodes), `bench` (this
   * process).
   */
  cpuSeconds: Record<string, number>;
  /** CPU seconds the whole machine ran over the same span, everyone's processes included. */
  machineCpuSeconds: number;
  /** Peak RSS in MiB over the measured span, same groups (without `bench`). */
  rssMiB: Record<string, number>;
  deaths: string[];
  warnings: { count: number; last: string[] };
}

export type RoundRecord = RoundMeasurement | { round: number; config: string; error: string };

export interface ConfigSummary {
  config: string;
  actorProcesses: number;
  rounds: number;
  failedRounds: number;
  opsPerSecond: number;
  /** Median ops/s of this configuration ÷ that of the first configuration. */
  ratio: number;
  createP50: number;
  createP99: number;
  getP50: number;
  getP99: number;
  /** Summed over rounds (measured load only; seeding failures are `seedErrors`). */
  errors: number;
  /** Failures while seeding and warming up, summed over rounds. */
  unmeasuredErrors: number;
  /** Median over rounds, per actor process. */
  actorCpuS: Record<string, number>;
  /** All actor processes together, per successful operation. */
  actorCpuUsPerOp: number;
  natsCpuS: number;
  gatewayCpuS: number;
  benchCpuS: number;
}

const measured = (r: RoundRecord): r is RoundMeasurement => !("error" in r);
const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);
const actorCpu = (r: RoundMeasurement) => sum(r.actors.map((a) => r.cpuSeconds[a] ?? 0));

export function summarizePlacement(records: RoundRecord[], configs: readonly PlacementConfig[]): ConfigSummary[] {
  const medianOps = (config: string) =>
    median(
      records
        .filter(measured)
        .filter((r) => r.config === config)
        .map((r) => r.load.opsPerSecond),
    );
  const base = medianOps(configs[0]!.label);
  return configs.map(({ label, actors }) => {
    const ok = records.filter(measured).filter((r) => r.config === label);
    // A round without a single success of a kind has no latency for it: left out, not NaN.
    const med = (pick: (r: RoundMeasurement) => number) => median(ok.map(pick).filter(Number.isFinite));
    const ops = medianOps(label);
    return {
      config: label,
      actorProcesses: actors.length,
      rounds: ok.length,
      failedRounds: records.filter((r) => r.config === label && !measured(r)).length,
      opsPerSecond: ops,
      ratio: base > 0 ? ops / base : NaN,
      createP50: med((r) => r.load.byKind.createTaskDO.p50),
      createP99: med((r) => r.load.byKind.createTaskDO.p99),
      getP50: med((r) => r.load.byKind.getTaskDO.p50),
      getP99: med((r) => r.load.byKind.getTaskDO.p99),
      errors: sum(ok.map((r) => r.load.errorCount)),
      unmeasuredErrors: sum(ok.map((r) => sum(Object.values(r.seedErrors)) + sum(Object.values(r.warmupErrors)))),
      actorCpuS: Object.fromEntries(actors.map((a) => [a, med((r) => r.cpuSeconds[a] ?? 0)])),
      actorCpuUsPerOp: med((r) => (r.load.ops ? (actorCpu(r) * 1e6) / r.load.ops : NaN)),
      natsCpuS: med((r) => r.cpuSeconds.nats ?? 0),
      gatewayCpuS: med((r) => r.cpuSeconds.gateway ?? 0),
      benchCpuS: med((r) => r.cpuSeconds.bench ?? 0),
    };
  });
}

const perActor = (cpu: Record<string, number>, actors: readonly string[]) =>
  actors.map((a) => fixed(2)(cpu[a] ?? NaN)).join(" + ");

export function formatSummary(rows: ConfigSummary[]): string {
  return markdownTable(
    [
      "actors",
      "rounds",
      "ops/s",
      "× 1 actor",
      "create p50 ms",
      "create p99 ms",
      "get p50 ms",
      "get p99 ms",
      "errors",
      "seed/warm-up errors",
      "actor CPU s",
      "actor CPU µs/op",
      "nats CPU s",
      "gateway CPU s",
      "bench CPU s",
    ],
    rows.map((r) => [
      r.config,
      r.failedRounds ? `${r.rounds} (${r.failedRounds} failed)` : String(r.rounds),
      count(r.opsPerSecond),
      fixed(2)(r.ratio),
      fixed(2)(r.createP50),
      fixed(2)(r.createP99),
      fixed(2)(r.getP50),
      fixed(2)(r.getP99),
      String(r.errors),
      String(r.unmeasuredErrors),
      perActor(r.actorCpuS, Object.keys(r.actorCpuS)),
      fixed(0)(r.actorCpuUsPerOp),
      fixed(2)(r.natsCpuS),
      fixed(2)(r.gatewayCpuS),
      fixed(2)(r.benchCpuS),
    ]),
  );
}

/**
 * `other CPU s`: what the machine ran besides this bench's processes (other work skews a round);
 * `busy %`: the machine's CPU seconds ÷ (seconds × cores); near 100 the cores, not the actors, are the limit.
 */
export function formatRounds(records: RoundRecord[], cores: number): string {
  return markdownTable(
    [
      "round",
      "actors",
      "ops/s",
      "errors",
      "CPU s per actor",
      "nats CPU s",
      "gateway CPU s",
      "bench CPU s",
      "other CPU s",
      "busy %",
      "start s",
    ],
    records.map((r) => {
      if (!measured(r)) return [String(r.round), `${r.config} (failed)`, ...Array<string>(9).fill("-")];
      const ours = sum(Object.values(r.cpuSeconds));
      return [
        String(r.round),
        r.config,
        count(r.load.opsPerSecond),
        String(r.load.errorCount),
        perActor(r.cpuSeconds, r.actors),
        fixed(2)(r.cpuSeconds.nats ?? NaN),
        fixed(2)(r.cpuSeconds.gateway ?? NaN),
        fixed(2)(r.cpuSeconds.bench ?? NaN),
        fixed(2)(Math.max(0, r.machineCpuSeconds - ours)),
        fixed(0)((r.machineCpuSeconds / (r.load.seconds * cores)) * 100),
        fixed(1)(r.startSeconds),
      ];
    }),
  );
}

/** Rounds in which other work took over a tenth of the machine: their numbers are suspect. */
export function noisyRounds(records: RoundRecord[], cores: number): string[] {
  return records.filter(measured).flatMap((r) => {
    const other = r.machineCpuSeconds - sum(Object.values(r.cpuSeconds));
    return other > 0.1 * r.load.seconds * cores ? [`round ${r.round} ${r.config} (${other.toFixed(2)} CPU s)`] : [];
  });
}

/** One line per finished round, printed as the rounds go. */
export function roundLine(r: RoundRecord): string {
  if (!measured(r)) return `  round ${r.round} ${r.config}: FAILED ${r.error}`;
  const kinds = Object.entries(r.load.byKind)
    .map(([kind, s]) => `${kind} p50 ${fixed(2)(s.p50)} p99 ${fixed(2)(s.p99)} ms`)
    .join(", ");
  const cpu = r.actors.map((a) => `${a} ${fixed(2)(r.cpuSeconds[a] ?? NaN)}`).join(", ");
  const notes = [
    r.load.errorCount ? `errors ${JSON.stringify(r.load.errors)} [${r.load.errorSamples.join("; ")}]` : "",
    Object.keys(r.seedErrors).length ? `seed errors ${JSON.stringify(r.seedErrors)}` : "",
    Object.keys(r.warmupErrors).length ? `warm-up errors ${JSON.stringify(r.warmupErrors)}` : "",
    r.deaths.length ? `died: ${r.deaths.join(", ")}` : "",
    r.warnings.count ? `${r.warnings.count} service warning line(s), last: ${r.warnings.last.at(-1)}` : "",
  ].filter(Boolean);
  const line =
    `  round ${r.round} ${r.config}: ${count(r.load.opsPerSecond)} ops/s, ${kinds}; CPU s ${cpu}, nats ` +
    `${fixed(2)(r.cpuSeconds.nats ?? NaN)}`;
  return [line, ...notes.map((n) => `    ${n}`)].join("\n");
}

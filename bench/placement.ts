// `npm run bench -- --placement`: task-object throughput on the 3-node R3 cluster with one vs
// two actor processes, loaded straight over NATS. Each round starts a fresh cluster per
// configuration, one at a time, in alternating order; every process is stopped, also on error.
import os from "node:os";
import { join } from "node:path";
import { cleanUpOnInterrupt, tempDir } from "./children.ts";
import type { BenchOptions, BenchRun } from "./options.ts";
import { startBenchCluster, type BenchCluster } from "./placement-cluster.ts";
import { objectNames, runTaskObjectLoad, seedObjects } from "./placement-load.ts";
import {
  formatRounds,
  formatSummary,
  noisyRounds,
  roundLine,
  summarizePlacement,
  type PlacementConfig,
  type RoundRecord,
} from "./placement-report.ts";
import { sampleUsage } from "./proc.ts";
import { pause } from "./stats.ts";
import { saveResults } from "./results.ts";

export interface PlacementSettings {
  rounds: number;
  /** Measured seconds per configuration per round. */
  seconds: number;
  /** Unmeasured seconds of the same load on each fresh cluster, after seeding. */
  warmupSeconds: number;
  /** Create-then-read workers, i.e. requests in flight. */
  inFlight: number;
  names: number;
  /** How the client reaches a name's owner. */
  routing: "owner" | "shared";
}

export const placementConfigs: readonly PlacementConfig[] = [
  { label: "1 actor", actors: ["actors-1"] },
  { label: "2 actors", actors: ["actors-1", "actors-2"] },
];

export function placementSettings(options: BenchOptions): PlacementSettings {
  return {
    rounds: options.rounds,
    seconds: options.duration,
    warmupSeconds: options.warmup,
    inFlight: options.connections,
    names: options.placementNames,
    routing: options.placementShared ? "shared" : "owner",
  };
}

/** Odd rounds run the configurations in order, even rounds in reverse: neither always goes first. */
export const roundOrder = (round: number): readonly PlacementConfig[] =>
  round % 2 ? placementConfigs : [...placementConfigs].reverse();

export const runPlacementBench: BenchRun = async (options, header, startedAt) => {
  const settings = placementSettings(options);
  const run = await tempDir("bench-placement-");
  const runDir = run.path;
  let current: BenchCluster | undefined;
  const cleanUp = cleanUpOnInterrupt(async () => {
    await current?.stop();
    await run.remove();
  });
  console.log(
    `\nplacement: ${settings.rounds} round(s) × ${placementConfigs.map((c) => c.label).join(" / ")}, ` +
      `${settings.seconds} s measured (${settings.warmupSeconds} s warm-up) each, ${settings.inFlight} in flight ` +
      `over ${settings.names} task objects, ` +
      `routed to ${settings.routing === "owner" ? "each name's owner" : "the shared subjects"}; ` +
      `3 NATS nodes, R3, a fresh cluster per configuration and round, in ${runDir}`,
  );
  const records: RoundRecord[] = [];
  try {
    for (let round = 1; round <= settings.rounds; round++) {
      for (const config of roundOrder(round)) {
        const record = await measureRound(
          round,
          config,
          settings,
          join(runDir, `round-${round}-${config.actors.length}-actors`),
          (c) => (current = c),
        );
        current = undefined;
        records.push(record);
        console.log(roundLine(record));
      }
    }
  } finally {
    await cleanUp();
  }
  const summary = summarizePlacement(records, placementConfigs);
  const cores = os.availableParallelism();
  console.log(`\nper round (CPU seconds over the measured span; busy % of ${cores} cores):\n`);
  console.log(formatRounds(records, cores));
  console.log(
    `\nmedian over ${settings.rounds} round(s) of ${settings.seconds} s, ${settings.inFlight} create-then-get ` +
      `workers over ${settings.names} task objects, direct NATS:\n`,
  );
  console.log(formatSummary(summary));
  const [one, two] = summary;
  console.log(
    `\nratio median(${two!.config}) / median(${one!.config}): ` +
      `${Number.isFinite(two!.ratio) ? two!.ratio.toFixed(2) : "-"}`,
  );
  for (const r of records) if ("error" in r) console.log(`round ${r.round} ${r.config} failed: ${r.error}`);
  const withErrors = records.filter((r) => !("error" in r) && r.load.errorCount > 0).length;
  if (withErrors)
    console.log(
      `\nwarning: ${withErrors} measured round(s) had errors (see above); their ops/s count successes only and are ` +
        `in the medians`,
    );
  const noisy = noisyRounds(records, cores);
  if (noisy.length)
    console.log(
      `\nwarning: other processes on the machine used over 10% of the CPU during ${noisy.join(", ")}; run again on ` +
        `a quiet machine`,
    );
  await saveResults(
    { ...header, settings, configs: placementConfigs, rounds: records, summary },
    startedAt,
    "placement",
  );
};

/** One configuration in one round: start, seed, warm up, measure, stop. A failure becomes `{ error }`. */
async function measureRound(
  round: number,
  config: PlacementConfig,
  settings: PlacementSettings,
  baseDir: string,
  onStarted: (cluster: BenchCluster) => void,
): Promise<RoundRecord> {
  const startedAt = performance.now();
  let cluster: BenchCluster | undefined;
  try {
    cluster = await startBenchCluster(config.actors, baseDir, settings.routing);
    onStarted(cluster);
    const startSeconds = (performance.now() - startedAt) / 1000;
    const names = objectNames(settings.names);
    const seed = await seedObjects(cluster.client, names, settings.inFlight);
    const load = { names, inFlight: settings.inFlight };
    const warmup =
      settings.warmupSeconds > 0
        ? await runTaskObjectLoad(cluster.client, { ...load, seconds: settings.warmupSeconds })
        : undefined;
    await pause(200);
    const sampler = sampleUsage(cluster.groups());
    const benchCpu = process.cpuUsage();
    const result = await runTaskObjectLoad(cluster.client, { ...load, seconds: settings.seconds });
    const usage = sampler.stop();
    const benchCpuUs = process.cpuUsage(benchCpu);
    return {
      round,
      config: config.label,
      actors: config.actors,
      startSeconds: Math.round(startSeconds * 10) / 10,
      seedErrors: seed.errors,
      warmupErrors: warmup?.errors ?? {},
      load: result,
      cpuSeconds: { ...usage.cpuSeconds, bench: Math.round((benchCpuUs.user + benchCpuUs.system) / 1e4) / 100 },
      machineCpuSeconds: usage.machineCpuSeconds,
      rssMiB: usage.rssMiB,
      deaths: cluster.deaths(),
      warnings: cluster.warnings(),
    };
  } catch (err) {
    const deaths = cluster?.deaths() ?? [];
    return { round, config: config.label, error: [(err as Error)?.message ?? String(err), ...deaths].join("; ") };
  } finally {
    await cluster?.stop();
  }
}

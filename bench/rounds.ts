// The comparison run: seed, warm up, then rounds that each run the baseline and every
// selected workload in turn (each beside its `--nats-compare` or `--service-compare` twin, the
// two taking turns to go first), so drift on the machine hits all of them alike. `measure`:
// one load with the processes' RSS and CPU meanwhile.
import type { Environment } from "./environment.ts";
import { roundOrder, withCompared, type ComparedServer } from "./compared.ts";
import { UsageError, type BenchOptions } from "./options.ts";
import { progressLine, summarize, type Outcome, type RoundRecord, type SummaryRow } from "./report.ts";
import { sampleUsage } from "./proc.ts";
import { createSeeds, waitForService } from "./seed.ts";
import { pause } from "./stats.ts";
import type { LoadSettings, ProcessGroups } from "./types.ts";
import { baseline, workloads, type Runner, type Workload, type WorkloadContext } from "./workloads.ts";

export interface RoundsOutcome {
  rounds: RoundRecord[];
  rows: SummaryRow[];
}

/**
 * One measured load: the runner's result plus the peak RSS and CPU of `groups` meanwhile; a failure becomes
 * `{ error }`.
 */
export async function measure(run: Runner, groups: ProcessGroups, settings: LoadSettings): Promise<Outcome> {
  const sampler = sampleUsage(groups);
  try {
    const result = await run(settings);
    return { ...result, ...sampler.stop() };
  } catch (err) {
    sampler.stop();
    return { error: (err as Error)?.message ?? String(err) };
  }
}

/** `measure`, after the runner's unmeasured `beforeEach` (a failure there is the load's). */
async function readyThenMeasure(run: Runner, groups: ProcessGroups, settings: LoadSettings): Promise<Outcome> {
  try {
    await run.beforeEach?.(settings);
  } catch (err) {
    return { error: `before the load: ${(err as Error)?.message ?? String(err)}` };
  }
  return measure(run, groups, settings);
}

const objectNames = Array.from({ length: 20 }, (_, k) => `bench-${k}`);

/** The workloads `--only` names, in their order; without it, all but the opt-in ones. */
export function selectWorkloads(only: string[] | undefined): Workload[] {
  if (!only) return anchorsBesideTwins(workloads.filter((w) => !w.optIn));
  const known = new Map(workloads.map((w) => [w.name, w]));
  const unknown = only.filter((name) => !known.has(name) && name !== baseline.name);
  if (unknown.length)
    throw new UsageError(`unknown workload(s) ${unknown.join(", ")}; known: ${[...known.keys()].join(", ")}`);
  return anchorsBesideTwins(workloads.filter((w) => only.includes(w.name)));
}

/** Each `anchor:<op>` row right after the service's `<op>` row when both run (measured and printed side by side). */
function anchorsBesideTwins(selected: readonly Workload[]): Workload[] {
  const isAnchor = (w: Workload) => w.serviceGroup === "anchor";
  const anchorOf = new Map(selected.filter(isAnchor).map((w) => [w.name.replace(/^anchor:/, ""), w]));
  const paired = new Set<Workload>();
  const rows = selected.flatMap((w) => {
    const anchor = isAnchor(w) ? undefined : anchorOf.get(w.name);
    if (anchor) paired.add(anchor);
    return isAnchor(w) ? [] : anchor ? [w, anchor] : [w];
  });
  return [...rows, ...selected.filter((w) => isAnchor(w) && !paired.has(w))];
}

async function prepareAll(selected: Workload[], ctx: WorkloadContext): Promise<Map<Workload, Runner | Error>> {
  const prepared = new Map<Workload, Runner | Error>();
  for (const workload of selected) {
    try {
      prepared.set(workload, await workload.prepare(ctx));
    } catch (err) {
      console.error(`  ${workload.name}: setup failed: ${(err as Error).message}`);
      prepared.set(workload, err as Error);
    }
  }
  return prepared;
}

/** What the workloads of `env` need: its URLs and connection, and its records (seeded lazily). */
async function contextOf(env: Environment, count: number): Promise<WorkloadContext> {
  await waitForService(env.taskUrl);
  const seeds = createSeeds({ taskUrl: env.taskUrl, jobUrl: env.jobUrl, count, objectNames });
  const noAuthSeeds = createSeeds({ taskUrl: env.noAuthTaskUrl, jobUrl: env.jobUrl, count, objectNames });
  const tracedSeeds = env.traced && createSeeds({ ...env.traced, count, objectNames });
  const anchorUrl = env.anchorUrl;
  const anchorSeeds = anchorUrl && createSeeds({ taskUrl: anchorUrl, jobUrl: anchorUrl, count, objectNames });
  return {
    ...env,
    seeds,
    noAuthSeeds,
    ...(tracedSeeds ? { tracedSeeds } : {}),
    ...(anchorSeeds ? { anchorSeeds } : {}),
    objectNames,
  };
}

export async function runRounds(
  env: Environment,
  options: BenchOptions,
  compared?: ComparedServer,
): Promise<RoundsOutcome> {
  const selected = withCompared([baseline, ...selectWorkloads(options.only)], compared);
  const context = await contextOf(env, options.seedCount);
  if (compared) context.compared = await contextOf(compared.env, options.seedCount);
  console.log(`setup: seeding ${options.seedCount} records per kind for the read workloads…`);
  const prepared = await prepareAll(selected, context);
  const groupsOf = (workload: Workload) =>
    (workload.onCompared && compared ? compared.env : env).groups(workload.serviceGroup);
  const deaths = () => [...env.deaths(), ...(compared?.env.deaths() ?? [])];
  const settings: LoadSettings = { connections: options.connections, duration: options.duration };

  if (options.warmup > 0) {
    console.log(`warm-up: ${options.warmup} s per workload (not measured)`);
    for (const run of prepared.values()) {
      if (typeof run !== "function") continue;
      const warmup = { ...settings, duration: options.warmup };
      try {
        await run.beforeEach?.(warmup);
        await run(warmup);
      } catch {
        // Not measured: a failing workload fails in the rounds.
      }
    }
  }

  const rounds: RoundRecord[] = [];
  const reported = new Set<string>();
  for (let round = 1; round <= options.rounds; round++) {
    console.log(
      `round ${round}/${options.rounds}: ${options.duration} s per workload, ${options.connections} connections`,
    );
    const results: RoundRecord["results"] = {};
    const baselineBefore: Record<string, Outcome> = {};
    const runBaseline = prepared.get(baseline);
    for (const workload of roundOrder([...prepared.keys()], round)) {
      const run = prepared.get(workload)!;
      // Paired: the baseline again right before each workload, so drift between the two is small.
      if (options.pairBaseline && workload !== baseline && typeof runBaseline === "function") {
        baselineBefore[workload.name] = await measure(runBaseline, groupsOf(baseline), settings);
        await pause();
      }
      const outcome =
        typeof run === "function"
          ? await readyThenMeasure(run, groupsOf(workload), settings)
          : { error: `setup failed: ${run.message}` };
      results[workload.name] = outcome;
      const base = baselineBefore[workload.name] ?? results[baseline.name];
      const baseRps = base && !("error" in base) && workload !== baseline ? base.rps : undefined;
      console.log(progressLine(round, workload.name, outcome, baseRps));
      for (const death of deaths().filter((d) => !reported.has(d))) {
        reported.add(death);
        console.error(`  warning: ${death}; the workloads that need it will fail`);
      }
      await pause();
    }
    rounds.push({ round, results, ...(options.pairBaseline ? { baselineBefore } : {}) });
  }
  return {
    rounds,
    rows: summarize(
      rounds,
      selected.map((w) => w.name),
      baseline.name,
    ),
  };
}

// `npm run bench`: the service against a bare node:http baseline in the same run, or with
// --growth the RSS and read latency as records pile up, with --microvm the microVM
// facility, or with --placement task objects on the cluster with 1 vs 2 actor processes.
// See bench/README-section.md.
import { startEnvironment, installShutdownHandlers, type Environment } from "./environment.ts";
import { runGrowth } from "./growth.ts";
import { benchCommand, describeMachine, formatMachine } from "./machine.ts";
import { helpText, isUsageError, parseOptions, type BenchOptions } from "./options.ts";
import { runMicrovmBench } from "./microvm.ts";
import { runMicrovmFlags } from "./microvm-flags.ts";
import { runPlacementBench } from "./placement.ts";
import { formatTable } from "./report.ts";
import { writeResults } from "./results.ts";
import { runRounds, selectWorkloads } from "./rounds.ts";

async function compare(env: Environment, options: BenchOptions, header: Record<string, unknown>, startedAt: Date) {
  const { rounds, rows } = await runRounds(env, options);
  console.log(`\nmedian over ${options.rounds} round(s) of ${options.duration} s, ${options.connections} connections:\n`);
  console.log(formatTable(rows));
  for (const row of rows.filter((r) => r.failures.length)) console.log(`\n${row.workload} failed: ${row.failures.join("; ")}`);
  const file = await writeResults({ ...header, rounds, summary: rows }, startedAt);
  console.log(`\nresults: ${file}`);
}

async function main() {
  const args = process.argv.slice(2);
  const options = parseOptions(args);
  if (options.help) {
    console.log(helpText);
    return;
  }
  if (!options.growth) selectWorkloads(options.only); // reject unknown names before starting anything
  const startedAt = new Date();
  const machine = describeMachine();
  const command = benchCommand(args);
  console.log(`command: ${command}\n${formatMachine(machine)}`);
  if (options.microvm || options.microvmFlags) {
    const header = { startedAt: startedAt.toISOString(), command, machine, options };
    return options.microvmFlags ? runMicrovmFlags(options, header, startedAt) : runMicrovmBench(options, header, startedAt);
  }
  if (options.placement) {
    const header = { startedAt: startedAt.toISOString(), command, machine, options };
    return runPlacementBench(options, header, startedAt);
  }

  let env: Environment | undefined;
  installShutdownHandlers(async () => {
    await env?.close();
  });
  env = await startEnvironment({ splitRoles: options.splitRoles, cpuProfDir: options.cpuProf });
  console.log(`service pid ${env.pids.service.join(",")}, nats-server pid ${env.pids.nats}, bare pid ${env.pids.bare}`);
  const header = { startedAt: startedAt.toISOString(), command, machine, options };
  try {
    if (options.growth) await runGrowth(env, options, header, startedAt);
    else await compare(env, options, header, startedAt);
  } finally {
    await env.close();
  }
  if (options.cpuProf) console.log(`cpu profiles in ${options.cpuProf} (npx tsx bench/profile-summary.ts ${options.cpuProf}/*.cpuprofile)`);
}

main().catch((err) => {
  if (isUsageError(err)) {
    console.error(`error: ${(err as Error).message} (see npm run bench -- --help)`);
    process.exitCode = 2;
    return;
  }
  console.error(`bench failed: ${(err as Error)?.stack ?? err}`);
  process.exitCode = 1;
});

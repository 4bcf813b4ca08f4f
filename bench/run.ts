// `npm run bench`: the service against a bare node:http baseline in the same run, or with
// --growth the RSS and read latency as records pile up, with --microvm the microVM
// facility, or with --placement task objects on the cluster with 1 vs 2 actor processes.
// See docs/performance.md.
import { anchorBucket } from "./anchor.ts";
import { installShutdownHandlers } from "./children.ts";
import { startEnvironment, mainSync, type Environment } from "./environment.ts";
import { runCliBench } from "./cli-start.ts";
import { runGrowth } from "./growth.ts";
import { benchCommand, describeMachine, formatMachine } from "./machine.ts";
import { helpText, isUsageError, parseOptions, UsageError, type BenchOptions } from "./options.ts";
import { runDefaultMicrovmRows, runImageBench, runLaunchBench, runMicrovmBench, runSnapshotBench } from "./microvm.ts";
import { runMicrovmBurst } from "./microvm-burst.ts";
import { runMicrovmFlags } from "./microvm-flags.ts";
import { checkoutLabel, formatTwinPairs, natsServerLabel, twinPairs, type ComparedServer } from "./compared.ts";
import { natsServerPath } from "../platform/index.ts";
import { runPlacementBench } from "./placement.ts";
import { chooseHttpDriver, type HttpDriver } from "./http-load.ts";
import { formatTable } from "./report.ts";
import { saveResults } from "./results.ts";
import { runRounds, selectWorkloads } from "./rounds.ts";
import { isListRow, LIST_CONNECTIONS, listWorkloads } from "./list-workloads.ts";

async function compare(
  env: Environment,
  options: BenchOptions,
  header: { driver: HttpDriver } & Record<string, unknown>,
  startedAt: Date,
  compared?: ComparedServer,
) {
  const { rounds, rows } = await runRounds(env, options, compared);
  // The list rows measure a page as one client walking a list sees it: their own connection count.
  const lists = rows.some((row) => isListRow(row.workload))
    ? ` (the list rows: ${LIST_CONNECTIONS} request at a time)`
    : "";
  console.log(
    `\nmedian over ${options.rounds} round(s) of ${options.duration} s, ${options.connections} ` +
      `connections${lists}, driver ${header.driver.name}:\n`,
  );
  console.log(formatTable(rows));
  for (const row of rows.filter((r) => r.failures.length))
    console.log(`\n${row.workload} failed: ${row.failures.join("; ")}`);
  const pairs = compared
    ? twinPairs(
        rounds,
        rows.map((r) => r.workload),
        compared.label,
      )
    : undefined;
  if (pairs) {
    console.log(`\neach row against its twin "@${compared!.label}", per round (this ÷ twin), median (min-max):\n`);
    console.log(formatTwinPairs(pairs));
  }
  await saveResults({ ...header, rounds, summary: rows, ...(pairs ? { pairs } : {}) }, startedAt);
}

async function main() {
  const args = process.argv.slice(2);
  const options = parseOptions(args);
  if (options.help) {
    console.log(helpText);
    return;
  }
  if (!options.growth) selectWorkloads(options.only); // reject unknown names before starting anything
  if (options.natsCompare && options.serviceCompare)
    throw new UsageError("--nats-compare and --service-compare: one twin per run, not both");
  const comparedNats = options.natsCompare ? natsServerLabel(options.natsCompare) : undefined;
  const comparedService = options.serviceCompare ? checkoutLabel(options.serviceCompare) : undefined;
  const mainService = options.serviceCheckout ? checkoutLabel(options.serviceCheckout) : undefined;
  const startedAt = new Date();
  const machine = describeMachine();
  const command = `${process.env.NATS_SYNC ? `NATS_SYNC=${process.env.NATS_SYNC} ` : ""}${benchCommand(args)}`;
  console.log(`command: ${command}\n${formatMachine(machine)}`);
  const header = { startedAt: startedAt.toISOString(), command, machine, options };
  if (options.microvmBurst) return runMicrovmBurst(options, header, startedAt);
  if (options.microvmLaunches) return runLaunchBench(options, header, startedAt);
  if (options.microvm || options.microvmFlags || options.microvmImages || options.microvmSnapshots) {
    if (options.microvmImages) return runImageBench(options, header, startedAt);
    if (options.microvmSnapshots) return runSnapshotBench(options, header, startedAt);
    return options.microvmFlags
      ? runMicrovmFlags(options, header, startedAt)
      : runMicrovmBench(options, header, startedAt);
  }
  if (options.cli)
    return runCliBench(options.quick ? 5 : args.includes("--rounds") ? options.rounds : 15, header, startedAt);
  if (options.placement) return runPlacementBench(options, header, startedAt);

  let env: Environment | undefined;
  let compared: ComparedServer | undefined;
  installShutdownHandlers(async () => {
    await compared?.env.close();
    await env?.close();
  });
  // Two more 3-node clusters: only when an R3 row is to run.
  const r3 = !options.growth && (options.only === undefined || options.only.some((name) => name.includes(":r3")));
  // The traced stack (tracing on, spans exported to a sink here): only when a :traced row runs.
  const traced =
    !options.growth && (options.only === undefined || options.only.some((name) => name.includes(":traced")));
  // The no-hop anchor (polka straight to KV): only when an anchor: row runs.
  const anchor =
    !options.growth && (options.only === undefined || options.only.some((name) => name.startsWith("anchor:")));
  // The list rows' stacks (one per size): only when a list row runs.
  const lists =
    !options.growth &&
    (options.only === undefined || options.only.some((name) => listWorkloads.some((w) => w.name === name)));
  const environment = {
    traced,
    lists,
    splitRoles: options.splitRoles,
    cpuProfDir: options.cpuProf,
    nodeFlags: options.nodeFlags,
    syncAlways: !options.growth,
    r3,
    anchor,
    checkout: mainService?.checkout,
  };
  env = await startEnvironment(environment);
  if (mainService)
    console.log(`the rows without "@": the service running ${mainService.checkout}/main.ts (${mainService.label})`);
  if ((comparedNats || comparedService) && !options.growth) {
    // The twin of a nats-server runs the same service (`--service-checkout`'s, when given).
    const twin = { ...environment, traced: false, anchor: false, lists: false };
    compared = comparedNats
      ? {
          kind: "nats",
          label: comparedNats,
          env: await startEnvironment({ ...twin, natsBinary: options.natsCompare }),
        }
      : {
          kind: "service",
          label: comparedService!.label,
          env: await startEnvironment({ ...twin, checkout: comparedService!.checkout }),
        };
    const on = comparedNats ? `on ${options.natsCompare}` : `running ${comparedService!.checkout}/main.ts`;
    console.log(
      `the "@${compared.label}" rows: the same stacks ${on} (service pid ` +
        `${compared.env.groups("service").service.join(",")}, nats-server pid ${compared.env.groups("service").nats}` +
        (compared.env.r3
          ? `, R3 nats pids ${compared.env.groups("r3").nats.join(",")} and ` +
            `${compared.env.groups("r3Always").nats.join(",")}`
          : "") +
        ")",
    );
  }
  console.log(
    `service pid ${env.groups("service").service.join(",")}, nats-server pid ${env.groups("service").nats} ` +
      `(${natsServerPath()} as npm start finds it, one nkey user per role, NATS_SYNC=${mainSync()}), bare pid ` +
      `${env.groups("bare").service}, ` +
      `auth-off service pid ${env.groups("noAuth").service.join(",")}`,
  );
  if (env.r3)
    console.log(
      `the :r3 workloads: R3 buckets on 3-node clusters, NATS_SYNC=1s (nats pids ` +
        `${env.groups("r3").nats.join(",")}) and always (${env.groups("r3Always").nats.join(",")})`,
    );
  if (env.anchorUrl)
    console.log(
      `the anchor: workloads: the no-hop anchor, pid ${env.groups("anchor").service.join(",")} (polka straight to ` +
        `KV, bucket ${anchorBucket}), on the service's nats-server with a login of its own`,
    );
  if (env.traced)
    console.log(
      `the :traced workloads: service pid ${env.groups("traced").service.join(",")} with ` +
        `OTEL_EXPORTER_OTLP_ENDPOINT set (spans exported to a sink in the bench; sampler ${samplerOf(process.env)})`,
    );
  if (env.always)
    console.log(
      `the :always workloads: service pid ${env.groups("always").service.join(",")}, nats-server pid ` +
        `${env.groups("always").nats} (NATS_SYNC=always)`,
    );
  const driver = chooseHttpDriver(options.driver);
  console.log(`HTTP load generator: ${driver.name} (${driver.version})`);
  try {
    if (options.growth) await runGrowth(env, options, { ...header, driver }, startedAt);
    else await compare(env, options, { ...header, driver }, startedAt, compared);
  } finally {
    await compared?.env.close(); // its own processes only: started second
    await env.close();
  }
  // The microVM rows, once the HTTP stacks are gone: the whole default run only.
  if (!options.growth && options.only === undefined && !options.noMicrovm && !mainService && !compared)
    await runDefaultMicrovmRows(options, header, startedAt);
  if (options.cpuProf)
    console.log(
      `cpu profiles in ${options.cpuProf} (npx tsx bench/profile-summary.ts ${options.cpuProf}/*.cpuprofile)`,
    );
}

/** The traced service's sampler, as the OpenTelemetry variables passed on to it name it. */
function samplerOf(env: NodeJS.ProcessEnv): string {
  const sampler = env.OTEL_TRACES_SAMPLER || "parentbased_always_on (the default)";
  return env.OTEL_TRACES_SAMPLER_ARG ? `${sampler}, OTEL_TRACES_SAMPLER_ARG=${env.OTEL_TRACES_SAMPLER_ARG}` : sampler;
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

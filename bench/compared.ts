// The twin rows of one run: `--nats-compare PATH` starts the service's stacks a second time with
// every nats-server of them running PATH (e.g. the previous release); `--service-compare DIR`
// starts them a second time running DIR's main.ts (another commit's checkout, e.g. the one
// before a change). Each workload that runs on those stacks is measured again on them right after
// itself in every round, as `<workload> @<label>`: a pair in one run, on the same machine load.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import type { Environment, ServiceGroup } from "./environment.ts";
import { cpuPerRequest, fixed, markdownTable, type RoundRecord } from "./report.ts";
import { median } from "./stats.ts";
import type { Measurement } from "./types.ts";
import { UsageError } from "./options.ts";
import type { Workload } from "./workloads.ts";

/**
 * The stacks the compared environment runs too: not the bare baseline; the auth-off one only
 * when the service differs (its nats-server is anonymous, not the twin's subject otherwise).
 */
const comparedGroups = (kind: ComparedKind) =>
  new Set<ServiceGroup>(["service", "always", "r3", "r3Always", ...(kind === "service" ? ["noAuth" as const] : [])]);

export type ComparedKind = "nats" | "service";

/** The environment the twin rows run on, and its label as the rows name it (`v2.10.27`, `624b62c`). */
export interface ComparedServer {
  readonly kind: ComparedKind;
  readonly label: string;
  readonly env: Environment;
}

/** `v2.10.27` from `PATH --version`; a usage error when PATH does not answer like nats-server. */
export function natsServerLabel(path: string): string {
  let output = "";
  try {
    output = execFileSync(path, ["--version"], { encoding: "utf8", timeout: 10_000 });
  } catch (err) {
    throw new UsageError(`--nats-compare ${path} does not run: ${(err as Error).message.split("\n")[0]}`);
  }
  const version = /nats-server: (v\d+\.\d+\.\d+)/.exec(output)?.[1];
  if (!version)
    throw new UsageError(`--nats-compare ${path} is not a nats-server (it answered "${output.trim().split("\n")[0]}")`);
  return version;
}

/**
 * DIR's absolute path and its commit (`624b62c`, `+` when it has changes); a usage error when DIR
 * is not a checkout of this service with its dependencies installed.
 */
export function checkoutLabel(dir: string): { checkout: string; label: string } {
  const checkout = resolve(dir);
  for (const needed of ["main.ts", "node_modules"])
    if (!existsSync(join(checkout, needed)))
      throw new UsageError(`--service-compare ${dir}: no ${needed} there (a checkout of this service, npm installed)`);
  const git = (...args: string[]) => execFileSync("git", ["-C", checkout, ...args], { encoding: "utf8" }).trim();
  try {
    const commit = git("rev-parse", "--short", "HEAD");
    const changed = git("status", "--porcelain", "--untracked-files=no") !== "";
    return { checkout, label: `${commit}${changed ? "+" : ""}` };
  } catch {
    return { checkout, label: checkout };
  }
}

/** Each workload followed by its twin on the compared stacks, where it has one. */
export function withCompared(
  selected: readonly Workload[],
  compared: Omit<ComparedServer, "env"> | undefined,
): Workload[] {
  if (!compared) return [...selected];
  const { label } = compared;
  const groups = comparedGroups(compared.kind);
  const what = compared.kind === "nats" ? `every nats-server ${label}` : `the service at ${label}`;
  return selected.flatMap((workload) =>
    groups.has(workload.serviceGroup)
      ? [
          workload,
          {
            name: `${workload.name} @${label}`,
            summary: `${workload.summary}, ${what}`,
            serviceGroup: workload.serviceGroup,
            onCompared: true,
            prepare: async (ctx) => {
              if (!ctx.compared) throw new Error("the compared stacks were not started");
              return workload.prepare(ctx.compared);
            },
          },
        ]
      : [workload],
  );
}

/** A row against its twin: per round, this row's figure ÷ the twin's; the median and range over rounds. */
export interface TwinPair {
  workload: string;
  twin: string;
  /** Rounds where both were measured. */
  rounds: number;
  /** req/s ÷ the twin's (above 1: this row is faster). */
  rps: { median: number; min: number; max: number };
  /** Service + nats-server CPU per request ÷ the twin's (above 1: this row costs more). */
  cpu: { median: number; min: number; max: number };
  /** p99 ÷ the twin's. */
  p99: { median: number; min: number; max: number };
}

const spread = (values: number[]) => ({
  median: median(values),
  min: values.length ? Math.min(...values) : Number.NaN,
  max: values.length ? Math.max(...values) : Number.NaN,
});

/**
 * Each row that has a twin (`<row> @<label>`), compared with it round by round: the two ran one
 * right after the other, so a ratio of the same round cancels the machine's drift between rounds.
 */
export function twinPairs(rounds: readonly RoundRecord[], names: readonly string[], label: string): TwinPair[] {
  const suffix = ` @${label}`;
  return names.flatMap((twin) => {
    if (!twin.endsWith(suffix)) return [];
    const workload = twin.slice(0, -suffix.length);
    const both = rounds.flatMap((r) => {
      const a = r.results[workload];
      const b = r.results[twin];
      return a && b && !("error" in a) && !("error" in b) && a.requests > 0 && b.requests > 0
        ? [{ a: a as Measurement, b: b as Measurement }]
        : [];
    });
    return [
      {
        workload,
        twin,
        rounds: both.length,
        rps: spread(both.map(({ a, b }) => a.rps / b.rps)),
        cpu: spread(both.map(({ a, b }) => cpuPerRequest(a) / cpuPerRequest(b))),
        p99: spread(both.map(({ a, b }) => a.p99 / b.p99)),
      },
    ];
  });
}

/** The pairs as a table: medians over rounds, with their range. */
export function formatTwinPairs(pairs: readonly TwinPair[]): string {
  const cell = (f: { median: number; min: number; max: number }) =>
    `${fixed(2)(f.median)} (${fixed(2)(f.min)}-${fixed(2)(f.max)})`;
  return markdownTable(
    ["workload", "rounds", "req/s ÷ twin", "CPU/req ÷ twin", "p99 ÷ twin"],
    pairs.map((p) => [p.workload, String(p.rounds), cell(p.rps), cell(p.cpu), cell(p.p99)]),
  );
}

/**
 * The order of one round: in even rounds each twin runs before its row, so neither side always
 * follows the other (a row's first seconds can pay for what the one before it left behind).
 */
export function roundOrder<T extends { onCompared?: boolean }>(workloads: readonly T[], round: number): T[] {
  const order = [...workloads];
  if (round % 2 === 1) return order;
  for (let i = 0; i + 1 < order.length; i++) {
    if (!order[i]!.onCompared && order[i + 1]!.onCompared) {
      [order[i], order[i + 1]] = [order[i + 1]!, order[i]!];
      i++;
    }
  }
  return order;
}

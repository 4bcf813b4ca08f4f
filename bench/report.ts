// Turns rounds of measurements into one row per workload (medians over rounds; error counts
// summed) and prints them as a Markdown table that reads in a terminal too.
import { median } from "./stats.ts";
import type { Measurement } from "./types.ts";

export type Outcome = Measurement | { error: string };

/** One round: the baseline first, then each workload, by name. */
export interface RoundRecord {
  round: number;
  results: Record<string, Outcome>;
  /** The baseline measured just before each workload (`--pair-baseline`), by workload name. */
  baselineBefore?: Record<string, Outcome>;
}

export interface SummaryRow {
  workload: string;
  /** Rounds that produced a measurement. */
  rounds: number;
  rps: number;
  /** Median over rounds of (this workload's req/s ÷ the baseline's in the same round, or just before it). */
  ratio: number;
  /**
   * Median over rounds of (the baseline's CPU per request ÷ this workload's, service plus
   * nats-server): the ratio the throughput would have on cores not shared with other work.
   */
  cpuRatio: number;
  p50: number;
  p99: number;
  /** Summed over rounds. */
  errors: number;
  unexpected: number;
  expected: number;
  serviceRssMiB: number;
  natsRssMiB: number;
  serviceCpuS: number;
  natsCpuS: number;
  /** Service CPU per completed request, in microseconds. */
  serviceCpuUsPerReq: number;
  /** nats-server CPU per completed request, in microseconds. */
  natsCpuUsPerReq: number;
  /**
   * The rest of the machine's busy CPU per completed request (the load generator, the bench
   * and any other work), in microseconds.
   */
  otherCpuUsPerReq: number;
  failures: string[];
}

const measured = (o: Outcome | undefined): o is Measurement => o !== undefined && !("error" in o);

export function summarize(rounds: RoundRecord[], names: string[], baselineName: string): SummaryRow[] {
  return names.map((workload) => {
    const pairs = rounds.map((r) => ({
      m: r.results[workload],
      base: r.baselineBefore?.[workload] ?? r.results[baselineName],
    }));
    const ok = pairs.filter((p) => measured(p.m)).map((p) => ({ m: p.m as Measurement, base: p.base }));
    const med = (pick: (m: Measurement) => number) => median(ok.map((p) => pick(p.m)));
    const total = (pick: (m: Measurement) => number) => ok.reduce((sum, p) => sum + pick(p.m), 0);
    const ratios = ok
      .filter((p) => measured(p.base) && p.base.rps > 0)
      .map((p) => p.m.rps / (p.base as Measurement).rps);
    const cpuRatios = ok
      .filter((p) => measured(p.base) && p.base.requests > 0)
      .map((p) => cpuPerRequest(p.base as Measurement) / cpuPerRequest(p.m));
    return {
      workload,
      rounds: ok.length,
      rps: med((m) => m.rps),
      ratio: median(ratios),
      cpuRatio: median(cpuRatios),
      p50: med((m) => m.p50),
      p99: med((m) => m.p99),
      errors: total((m) => m.errors),
      unexpected: total((m) => m.unexpected),
      expected: total((m) => m.expected),
      serviceRssMiB: med((m) => m.rssMiB.service ?? 0),
      natsRssMiB: med((m) => m.rssMiB.nats ?? 0),
      serviceCpuS: med((m) => m.cpuSeconds.service ?? 0),
      natsCpuS: med((m) => m.cpuSeconds.nats ?? 0),
      serviceCpuUsPerReq: med((m) => (m.requests ? ((m.cpuSeconds.service ?? 0) * 1e6) / m.requests : NaN)),
      natsCpuUsPerReq: med((m) => (m.requests ? ((m.cpuSeconds.nats ?? 0) * 1e6) / m.requests : NaN)),
      otherCpuUsPerReq: med((m) => (m.requests ? (otherCpuSeconds(m) * 1e6) / m.requests : NaN)),
      failures: pairs.flatMap((p) => (p.m && "error" in p.m ? [p.m.error] : [])),
    };
  });
}

/** The machine's busy CPU seconds during the load beyond the service's and nats-server's. */
const otherCpuSeconds = (m: Measurement) =>
  Math.max(0, m.machineCpuSeconds - (m.cpuSeconds.service ?? 0) - (m.cpuSeconds.nats ?? 0));

/** Service plus nats-server CPU seconds per completed request. */
export const cpuPerRequest = (m: Measurement) => ((m.cpuSeconds.service ?? 0) + (m.cpuSeconds.nats ?? 0)) / m.requests;

/** A cell: `digits` decimals, "-" for a figure that is missing (NaN, undefined). */
export const fixed = (digits: number) => (n: number | undefined) =>
  n !== undefined && Number.isFinite(n) ? n.toFixed(digits) : "-";
/** A cell: a whole count with thousands separators, "-" when missing. */
export const count = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "-");
const columns: [string, (row: SummaryRow) => string][] = [
  ["workload", (r) => r.workload],
  ["req/s", (r) => (Number.isFinite(r.rps) ? Math.round(r.rps).toLocaleString("en-US") : "failed")],
  ["× bare", (r) => fixed(2)(r.ratio)],
  ["× bare per CPU", (r) => fixed(2)(r.cpuRatio)],
  ["p50 ms", (r) => fixed(2)(r.p50)],
  ["p99 ms", (r) => fixed(2)(r.p99)],
  ["errors", (r) => String(r.errors)],
  ["non-2xx", (r) => String(r.unexpected)],
  ["expected 404", (r) => (r.expected ? String(r.expected) : "-")],
  ["svc RSS MiB", (r) => fixed(0)(r.serviceRssMiB)],
  ["nats RSS MiB", (r) => fixed(0)(r.natsRssMiB)],
  ["svc CPU µs/req", (r) => fixed(0)(r.serviceCpuUsPerReq)],
  ["nats CPU µs/req", (r) => fixed(0)(r.natsCpuUsPerReq)],
  ["other CPU µs/req", (r) => fixed(0)(r.otherCpuUsPerReq)],
];

/** A Markdown table with aligned columns (numbers right-aligned). */
export function formatTable(rows: SummaryRow[]): string {
  return markdownTable(
    columns.map(([title]) => title),
    rows.map((row) => columns.map(([, cell]) => cell(row))),
  );
}

/** Columns whose cells are all numbers (or "-") are right-aligned. */
export function markdownTable(header: string[], body: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((cells) => cells[i]!.length)));
  const numeric = header.map((_, i) => body.every((cells) => /^(-|[-\d.,]+%?)$/.test(cells[i]!)));
  const line = (cells: string[]) =>
    `| ${cells.map((c, i) => (numeric[i] ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(" | ")} |`;
  const rule = `|${widths.map((w, i) => (numeric[i] ? `${"-".repeat(w + 1)}:` : "-".repeat(w + 2))).join("|")}|`;
  return [line(header), rule, ...body.map(line)].join("\n");
}

/** One line for a finished measurement, printed as the rounds go. */
export function progressLine(round: number, name: string, outcome: Outcome, baselineRps?: number): string {
  if ("error" in outcome) return `  round ${round} ${name}: FAILED ${outcome.error}`;
  const ratio = baselineRps ? ` (${(outcome.rps / baselineRps).toFixed(2)}× bare)` : "";
  const trouble = outcome.errors || outcome.unexpected ? ` errors ${outcome.errors} non-2xx ${outcome.unexpected}` : "";
  const sample = outcome.errorSamples.length ? ` [${outcome.errorSamples.join("; ")}]` : "";
  return (
    `  round ${round} ${name}: ${Math.round(outcome.rps)} req/s${ratio}, p50 ${outcome.p50.toFixed(2)} ms, ` +
    `p99 ${outcome.p99.toFixed(2)} ms${trouble}${sample}`
  );
}

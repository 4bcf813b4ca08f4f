// The providers side by side, measured in the same run: one row per metric with each
// provider's value, the ratios sandbox / process and gvisor / sandbox, and the targets issues
// 11, 13 and 23 hold a provider to (a bound, or a factor of another provider's value), each
// with its verdict; a target of a provider not measured says so.
import type { DensityPoint } from "./microvm-density.ts";
import type { Percentiles } from "./stats.ts";
import { imageTargets, type ImageResults } from "./microvm-images.ts";
import type { ProviderName } from "./microvm-instance-procs.ts";
import type { LaunchResults, SuspendResults } from "./microvm-lifecycle.ts";
import type { RpcPath } from "./microvm-rpc.ts";
import { markdownTable } from "./report.ts";

/** What one provider's service measured. */
export interface ProviderResults {
  launches: LaunchResults;
  getMicrovm: Percentiles;
  /** The host proxy's paths (client stub, raw http). */
  rpc: RpcPath[];
  suspend: SuspendResults;
  /** createImage with the check in an instance of this provider, and uncached vs cached launches. */
  images: ImageResults;
  /** `node -e 0` in the wall's trial sandbox, outside any instance cgroup (microvm-launch-floor.ts). */
  launchFloor: Percentiles;
  density: DensityPoint[];
  /** Why density stopped before its last level (a launch failed or timed out while filling). */
  densityFailures: string[];
  deaths: string[];
}

/** What the sandbox is held to (issue 11), p50 in ms. */
export const sandboxTargets = { firstRpcMs: 250, proxyRpcMs: 1, suspendResumeMs: 10 } as const;

/**
 * What gVisor is held to (issue 23), p50: first RPC as a factor of the sandbox's, ms otherwise;
 * its suspend and resume store and restore a snapshot (issue 26: 500 ms), the sandbox's freeze.
 */
export const gvisorTargets = {
  firstRpcVsSandbox: 1.5,
  proxyRpcMs: 2,
  registrationMs: 1_000,
  suspendResumeMs: 500,
} as const;

/** A bound on one provider's value: absolute, or `bound` times `relativeTo`'s value in the same run. */
export interface Target {
  provider: ProviderName;
  bound: number;
  relativeTo?: ProviderName;
  issue: number;
}

export interface ComparisonRow {
  metric: string;
  values: Partial<Record<ProviderName, number>>;
  targets: Target[];
}

export interface Verdict {
  metric: string;
  target: Target;
  value: number | undefined;
  /** The bound in the metric's unit (a relative one resolved against this run's value). */
  limit: number | undefined;
  /** undefined: not measured (the provider, or the one it is relative to, did not run). */
  met: boolean | undefined;
}

type Results = Partial<Record<ProviderName, ProviderResults>>;

const rawProxy = (r: ProviderResults) => r.rpc.find((p) => p.path.startsWith("raw"));
const stubProxy = (r: ProviderResults) => r.rpc.find((p) => p.path.startsWith("stub"));

/** The rows, in the order the table prints them. */
export function comparisonRows(results: Results): ComparisonRow[] {
  const row = (metric: string, pick: (r: ProviderResults) => number | undefined, targets: Target[] = []) => ({
    metric,
    values: Object.fromEntries(
      Object.entries(results).map(([name, r]) => [name, pick(r)] as const),
    ) as ComparisonRow["values"],
    targets,
  });
  const s = sandboxTargets;
  const g = gvisorTargets;
  const firstRpcTargets: Target[] = [
    { provider: "sandbox", bound: s.firstRpcMs, issue: 11 },
    { provider: "gvisor", bound: g.firstRpcVsSandbox, relativeTo: "sandbox", issue: 23 },
  ];
  // The sandbox freezes (issue 11); gVisor stores and restores a snapshot (issue 26).
  const suspendTargets: Target[] = [
    { provider: "sandbox", bound: s.suspendResumeMs, issue: 11 },
    { provider: "gvisor", bound: g.suspendResumeMs, issue: 26 },
  ];
  return [
    row("RunMicrovm → RUNNING p50 ms", (r) => r.launches.running.p50),
    row("  of which provider start (spawn → runtime answers) p50 ms", (r) => r.launches.breakdown.providerStart.p50),
    row("RunMicrovm → first RPC p50 ms (poll RUNNING, token, hello)", (r) => r.launches.firstRpc.p50, firstRpcTargets),
    row("RunMicrovm → first RPC p99 ms (poll RUNNING, token, hello)", (r) => r.launches.firstRpc.p99),
    row("RunMicrovm → first RPC p50 ms (token at once, retry hello)", (r) => r.launches.firstRpcEager.p50, [
      { provider: "sandbox", bound: s.firstRpcMs, issue: 11 },
    ]),
    row("cold first launch → first RPC ms (bundles the image)", (r) => r.launches.coldFirstRpcMs),
    row("floor: node -e 0 in the wall's trial sandbox, no cgroup, p50 ms", (r) => r.launchFloor.p50),
    row("TerminateMicrovm → TERMINATED p50 ms", (r) => r.launches.terminate.p50),
    row("proxied RPC p50 ms (raw keep-alive http)", (r) => rawProxy(r)?.sequential.p50, [
      { provider: "sandbox", bound: s.proxyRpcMs, issue: 11 },
      { provider: "gvisor", bound: g.proxyRpcMs, issue: 23 },
    ]),
    row("proxied RPC p99 ms (raw keep-alive http)", (r) => rawProxy(r)?.sequential.p99),
    row("proxied RPC p50 ms (client stub, fetch)", (r) => stubProxy(r)?.sequential.p50),
    row("proxied RPC req/s, 20 callers (raw)", (r) => rawProxy(r)?.concurrent.rps),
    row("CPU µs per proxied call: service", (r) => rawProxy(r)?.cpuUsPerCall.service),
    row("CPU µs per proxied call: instance (all its processes)", (r) => rawProxy(r)?.cpuUsPerCall.instance),
    row("SuspendMicrovm → SUSPENDED seen p50 ms", (r) => r.suspend.suspendObserved.p50, suspendTargets),
    row("ResumeMicrovm → RUNNING seen p50 ms", (r) => r.suspend.resumeObserved.p50, suspendTargets),
    row(
      "auto-resume: first RPC to a SUSPENDED instance p50 ms",
      (r) => r.suspend.autoResumeFirstCall.p50,
      suspendTargets,
    ),
    row("image push: createImage → registered p50 ms (check in an instance)", (r) => r.images.registration.p50, [
      { provider: "sandbox", bound: imageTargets.registrationMs, issue: 13 },
      { provider: "gvisor", bound: g.registrationMs, issue: 23 },
    ]),
    row("image: first RPC, module cached p50 ms", (r) => r.images.cachedFirstRpc.p50),
    row("image: not cached − cached p50 ms", (r) => r.images.uncachedExtra.p50, [
      { provider: "sandbox", bound: imageTargets.uncachedExtraMs, issue: 13 },
    ]),
    ...densityRows(results, row),
  ];
}

function densityRows(
  results: Results,
  row: (metric: string, pick: (r: ProviderResults) => number | undefined) => ComparisonRow,
): ComparisonRow[] {
  const measured = Object.values(results);
  const levels = (measured[0]?.density ?? [])
    .map((p) => p.live)
    .filter((live) => measured.every((r) => r.density.some((p) => p.live === live)));
  if (levels.length === 0) return [];
  const at = (r: ProviderResults, live: number) => r.density.find((p) => p.live === live)!;
  const top = Math.max(...levels);
  const rows: ComparisonRow[] = [];
  for (const live of [...new Set([Math.min(...levels), top])]) {
    rows.push(
      row(`memory per instance, PSS MiB (${live} live; all its processes)`, (r) => at(r, live).perInstance.pss),
      row(`memory per instance, cgroup charged MiB (${live} live)`, (r) => at(r, live).cgroupPerInstance?.usage),
      row(`memory per instance, cgroup anon MiB (${live} live)`, (r) => at(r, live).cgroupPerInstance?.anon),
      row(`memory per instance, VmRSS MiB (${live} live; all its processes)`, (r) => at(r, live).perInstance.rss),
      row(`memory per instance, private anon MiB (${live} live)`, (r) => at(r, live).perInstance.anon),
    );
  }
  rows.push(
    row(`processes per instance`, (r) => at(r, top).processes / Math.max(1, at(r, top).instances)),
    row(`service VmRSS MiB (${top} live)`, (r) => at(r, top).serviceMiB.rss),
    row(`proxied RPC p50 ms (${top} live)`, (r) => at(r, top).rpc.p50),
    row(`RunMicrovm → RUNNING p50 ms (${top} live)`, (r) => at(r, top).running.p50),
  );
  return rows;
}

/** Every target of every row, checked against this run's values. */
export function verdicts(rows: ComparisonRow[]): Verdict[] {
  return rows.flatMap((row) =>
    row.targets.map((target) => {
      const value = row.values[target.provider];
      const base = target.relativeTo === undefined ? 1 : row.values[target.relativeTo];
      const limit = base === undefined || !Number.isFinite(base) ? undefined : target.bound * base;
      const met = value === undefined || limit === undefined || !Number.isFinite(value) ? undefined : value <= limit;
      return { metric: row.metric, target, value, limit, met };
    }),
  );
}

const num = (n: number | undefined) =>
  n === undefined || !Number.isFinite(n) ? "-" : Math.abs(n) >= 100 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1);
/** Only of positive values: a difference that came out negative (noise) has no meaningful ratio. */
const ratio = (a: number | undefined, b: number | undefined) =>
  a === undefined || b === undefined || !(a > 0 && b > 0) ? "-" : `${(a / b).toFixed(2)}x`;
const bound = (t: Target) => (t.relativeTo ? `${t.bound}x ${t.relativeTo}` : String(t.bound));
const outcome = (met: boolean | undefined) => (met === undefined ? "not measured" : met ? "met" : "MISSED");

export function formatComparison(rows: ComparisonRow[], providers: readonly ProviderName[]): string {
  return markdownTable(
    ["metric", ...providers, "sandbox/process", "gvisor/sandbox", "targets (p50)"],
    rows.map((r) => [
      r.metric,
      ...providers.map((p) => num(r.values[p])),
      ratio(r.values.sandbox, r.values.process),
      ratio(r.values.gvisor, r.values.sandbox),
      verdicts([r])
        .map((v) => `${v.target.provider} ≤ ${bound(v.target)} (#${v.target.issue}): ${outcome(v.met)}`)
        .join("; ") || "-",
    ]),
  );
}

/** One line per target: the value, the bound it resolves to in this run, and whether it is met. */
export function formatVerdicts(list: Verdict[]): string {
  return markdownTable(
    ["issue", "provider", "metric", "value", "target", "result"],
    list.map((v) => [
      `#${v.target.issue}`,
      v.target.provider,
      v.metric.trim(),
      num(v.value),
      `≤ ${bound(v.target)}${v.target.relativeTo ? ` = ${num(v.limit)}` : ""}`,
      outcome(v.met),
    ]),
  );
}

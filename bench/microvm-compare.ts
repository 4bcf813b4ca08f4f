// The sandbox's cost against the process provider, measured in the same run: one row per
// metric with both values, their ratio (sandbox / process) and, where issue 11 sets one, the
// target the sandbox is held to and whether it meets it.
import type { DensityPoint } from "./microvm-density.ts";
import type { Percentiles } from "./microvm-http.ts";
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
  density: DensityPoint[];
  deaths: string[];
}

/** What the sandbox is held to (issue 11), p50 in ms. */
export const sandboxTargets = { firstRpcMs: 250, proxyRpcMs: 1, suspendResumeMs: 10 } as const;

export interface ComparisonRow {
  metric: string;
  process: number | undefined;
  sandbox: number | undefined;
  /** Upper bound on the sandbox's value. */
  target?: number;
}

const rawProxy = (r: ProviderResults) => r.rpc.find((p) => p.path.startsWith("raw"));
const stubProxy = (r: ProviderResults) => r.rpc.find((p) => p.path.startsWith("stub"));

/** The rows, in the order the table prints them. */
export function comparisonRows(process: ProviderResults, sandbox: ProviderResults): ComparisonRow[] {
  const row = (metric: string, pick: (r: ProviderResults) => number | undefined, target?: number): ComparisonRow => ({
    metric,
    process: pick(process),
    sandbox: pick(sandbox),
    ...(target === undefined ? {} : { target }),
  });
  const t = sandboxTargets;
  const rows = [
    row("RunMicrovm → RUNNING p50 ms", (r) => r.launches.running.p50),
    row("  of which provider start (spawn → runtime answers) p50 ms", (r) => r.launches.breakdown.providerStart.p50),
    row("RunMicrovm → first RPC p50 ms (poll RUNNING, token, hello)", (r) => r.launches.firstRpc.p50, t.firstRpcMs),
    row(
      "RunMicrovm → first RPC p50 ms (token at once, retry hello)",
      (r) => r.launches.firstRpcEager.p50,
      t.firstRpcMs,
    ),
    row("cold first launch → first RPC ms (bundles the image)", (r) => r.launches.coldFirstRpcMs),
    row("TerminateMicrovm → TERMINATED p50 ms", (r) => r.launches.terminate.p50),
    row("proxied RPC p50 ms (raw keep-alive http)", (r) => rawProxy(r)?.sequential.p50, t.proxyRpcMs),
    row("proxied RPC p99 ms (raw keep-alive http)", (r) => rawProxy(r)?.sequential.p99),
    row("proxied RPC p50 ms (client stub, fetch)", (r) => stubProxy(r)?.sequential.p50),
    row("proxied RPC req/s, 20 callers (raw)", (r) => rawProxy(r)?.concurrent.rps),
    row("CPU µs per proxied call: service", (r) => rawProxy(r)?.cpuUsPerCall.service),
    row("CPU µs per proxied call: instance runtime", (r) => rawProxy(r)?.cpuUsPerCall.instance),
    row("SuspendMicrovm → SUSPENDED seen p50 ms", (r) => r.suspend.suspendObserved.p50, t.suspendResumeMs),
    row("ResumeMicrovm → RUNNING seen p50 ms", (r) => r.suspend.resumeObserved.p50, t.suspendResumeMs),
    row(
      "auto-resume: first RPC to a SUSPENDED instance p50 ms",
      (r) => r.suspend.autoResumeFirstCall.p50,
      t.suspendResumeMs,
    ),
  ];
  const levels = process.density.map((p) => p.live).filter((live) => sandbox.density.some((p) => p.live === live));
  const at = (r: ProviderResults, live: number) => r.density.find((p) => p.live === live)!;
  const top = Math.max(...levels);
  for (const live of [Math.min(...levels), top].filter(
    (live, i, all) => Number.isFinite(live) && all.indexOf(live) === i,
  )) {
    rows.push(
      row(`memory per instance, PSS MiB (${live} live; all its processes)`, (r) => at(r, live).perInstance.pss),
      row(`memory per instance, VmRSS MiB (${live} live; all its processes)`, (r) => at(r, live).perInstance.rss),
      row(`memory per instance, private anon MiB (${live} live)`, (r) => at(r, live).perInstance.anon),
      row(`memory per instance, cgroup charged MiB (${live} live)`, (r) => at(r, live).cgroupPerInstance?.usage),
    );
  }
  if (Number.isFinite(top)) {
    rows.push(
      row(`processes per instance`, (r) => at(r, top).processes / Math.max(1, at(r, top).instances)),
      row(`service VmRSS MiB (${top} live)`, (r) => at(r, top).serviceMiB.rss),
      row(`proxied RPC p50 ms (${top} live)`, (r) => at(r, top).rpc.p50),
      row(`RunMicrovm → RUNNING p50 ms (${top} live)`, (r) => at(r, top).running.p50),
    );
  }
  return rows;
}

const num = (n: number | undefined) =>
  n === undefined || !Number.isFinite(n) ? "-" : Math.abs(n) >= 100 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1);

export function formatComparison(rows: ComparisonRow[]): string {
  return markdownTable(
    ["metric", "process", "sandbox", "ratio", "target (sandbox)", "met?"],
    rows.map((r) => {
      const ratio = r.process && r.sandbox !== undefined ? `${(r.sandbox / r.process).toFixed(2)}x` : "-";
      const met = r.target === undefined ? "-" : r.sandbox !== undefined && r.sandbox <= r.target ? "yes" : "NO";
      return [r.metric, num(r.process), num(r.sandbox), ratio, r.target === undefined ? "-" : `≤ ${r.target}`, met];
    }),
  );
}

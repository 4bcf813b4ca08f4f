// Tables of the microVM bench, per provider: latencies against their targets (PASS/MISS on
// p50), RPC paths side by side (sequential, concurrent, CPU per call), and density (memory and
// latency by live instances). The providers side by side: microvm-compare.ts.
import type { DensityPoint } from "./microvm-density.ts";
import type { Percentiles } from "./stats.ts";
import type { LaunchResults, SuspendResults } from "./microvm-lifecycle.ts";
import type { RpcPath } from "./microvm-rpc.ts";
import { markdownTable } from "./report.ts";

/** The targets the microVM facility is held to (p50, or MiB for memory). */
export const targets = {
  firstRpcMs: 200,
  proxyRpcMs: 1,
  suspendResumeMs: 10,
  instanceMiB: 40,
} as const;

export interface LatencyRow {
  name: string;
  stats: Percentiles;
  /** Target on p50, ms. */
  target?: number;
}

const single = (value: number): Percentiles => ({ n: 1, p50: value, p99: value, mean: value });
const ms = (n: number) => (Number.isFinite(n) ? n.toFixed(n < 10 ? 2 : 1) : "-");
const verdict = (value: number, target?: number) =>
  target === undefined ? "" : !Number.isFinite(value) ? "MISS" : value <= target ? "PASS" : "MISS";

/** The bounds a provider's rows are held to (the sandbox: issue 11's 250 ms; gVisor: issue 23's). */
export interface LatencyLimits {
  firstRpcMs: number;
  proxyRpcMs: number;
  /** Suspend, resume and auto-resume (default `targets.suspendResumeMs`, the freezer's). */
  suspendResumeMs?: number;
}

export function latencyRows(
  launches: LaunchResults,
  rpc: RpcPath[],
  suspend: SuspendResults,
  getMicrovm: Percentiles,
  limits: LatencyLimits = { firstRpcMs: targets.firstRpcMs, proxyRpcMs: targets.proxyRpcMs },
): LatencyRow[] {
  const firstRpcTarget = limits.firstRpcMs;
  const suspendTarget = limits.suspendResumeMs ?? targets.suspendResumeMs;
  const rpcRows = rpc.map((path) => ({
    name: `RPC ${path.path}`,
    stats: path.sequential,
    ...(path.path.includes("host proxy") ? { target: limits.proxyRpcMs } : {}),
  }));
  return [
    { name: "RunMicrovm answered (PENDING)", stats: launches.runAnswered },
    {
      name: "cold: first launch on a fresh host → first RPC (bundles the image)",
      stats: single(launches.coldFirstRpcMs),
    },
    { name: "RunMicrovm → RUNNING (GetMicrovm every ~5 ms)", stats: launches.running },
    { name: "  of which: provider start (spawn → runtime answers)", stats: launches.breakdown.providerStart },
    { name: "  of which: runtime answers → RUNNING record written", stats: launches.breakdown.recordWrite },
    { name: "  of which: record written → seen by GetMicrovm poll", stats: launches.breakdown.observedAfterWrite },
    { name: "RunMicrovm → first RPC (RUNNING, token, stub.hello)", stats: launches.firstRpc, target: firstRpcTarget },
    {
      name: "RunMicrovm → first RPC (token at once, retry every ~5 ms)",
      stats: launches.firstRpcEager,
      target: firstRpcTarget,
    },
    { name: "TerminateMicrovm → TERMINATED", stats: launches.terminate },
    { name: "GetMicrovm round trip (NATS → host → KV), one at a time", stats: getMicrovm },
    ...rpcRows,
    { name: "SuspendMicrovm answered", stats: suspend.suspendAnswer },
    {
      name: "SuspendMicrovm → SUSPENDED seen by GetMicrovm",
      stats: suspend.suspendObserved,
      target: suspendTarget,
    },
    { name: "ResumeMicrovm answered", stats: suspend.resumeAnswer },
    {
      name: "ResumeMicrovm → RUNNING seen by GetMicrovm",
      stats: suspend.resumeObserved,
      target: suspendTarget,
    },
    {
      name: "auto-resume: first raw RPC to a SUSPENDED instance",
      stats: suspend.autoResumeFirstCall,
      target: suspendTarget,
    },
    { name: "  the raw RPC right after it", stats: suspend.callAfterAutoResume },
  ];
}

export function formatLatencies(rows: LatencyRow[]): string {
  return markdownTable(
    ["measurement", "n", "p50 ms", "p99 ms", "target p50", "result"],
    rows.map((row) => [
      row.name,
      String(row.stats.n),
      ms(row.stats.p50),
      ms(row.stats.p99),
      row.target === undefined ? "-" : `≤ ${ms(row.target)} ms`,
      verdict(row.stats.p50, row.target) || "-",
    ]),
  );
}

export function formatRpcPaths(paths: RpcPath[]): string {
  return markdownTable(
    ["path", "seq p50 ms", "seq p99 ms", "callers", "req/s", "conc p50 ms", "conc p99 ms", "CPU µs/call"],
    paths.map((p) => [
      p.path,
      ms(p.sequential.p50),
      ms(p.sequential.p99),
      String(p.concurrent.callers),
      String(p.concurrent.rps),
      ms(p.concurrent.p50),
      ms(p.concurrent.p99),
      Object.entries(p.cpuUsPerCall)
        .map(([name, us]) => `${name} ${us}`)
        .join(", "),
    ]),
  );
}

export function formatDensity(points: DensityPoint[]): string {
  return markdownTable(
    [
      "live",
      "found",
      "procs",
      "VmRSS MiB/inst",
      "target",
      "result",
      "PSS MiB/inst",
      "anon MiB/inst",
      "cgroup MiB/inst",
      "service RSS MiB",
      "RPC p50 ms",
      "RPC p99 ms",
      "Run→RUNNING p50 ms",
      "p99 ms",
    ],
    points.map((p) => [
      String(p.live),
      String(p.instances),
      String(p.processes),
      p.perInstance.rss.toFixed(1),
      `≤ ${targets.instanceMiB}`,
      verdict(p.perInstance.rss, targets.instanceMiB),
      p.perInstance.pss.toFixed(1),
      p.perInstance.anon.toFixed(1),
      p.cgroupPerInstance ? p.cgroupPerInstance.usage.toFixed(1) : "-",
      p.serviceMiB.rss.toFixed(0),
      ms(p.rpc.p50),
      ms(p.rpc.p99),
      ms(p.running.p50),
      ms(p.running.p99),
    ]),
  );
}

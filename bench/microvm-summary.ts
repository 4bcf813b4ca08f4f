// What `--microvm` prints at the end: per provider its latencies against the targets it is
// held to, image rows and density; the RPC paths of all; then the providers side by side with
// their ratios, and every target of issues 11, 13 and 23 with its verdict, missed ones included.
import {
  formatComparison,
  formatVerdicts,
  gvisorTargets,
  sandboxTargets,
  verdicts,
  type ComparisonRow,
  type ProviderResults,
} from "./microvm-compare.ts";
import { formatImages } from "./microvm-images.ts";
import type { ProviderName } from "./microvm-instance-procs.ts";
import {
  formatDensity,
  formatLatencies,
  formatRpcPaths,
  latencyRows,
  targets,
  type LatencyLimits,
} from "./microvm-report.ts";
import type { RpcPath, RpcSettings } from "./microvm-rpc.ts";

/** The sandbox: issue 11; gVisor: issue 23, its first RPC bound resolved against this run's sandbox p50. */
function limitsOf(provider: ProviderName, results: Partial<Record<ProviderName, ProviderResults>>): LatencyLimits {
  if (provider === "sandbox") return { firstRpcMs: sandboxTargets.firstRpcMs, proxyRpcMs: sandboxTargets.proxyRpcMs };
  if (provider === "gvisor") {
    const sandbox = results.sandbox?.launches.firstRpc.p50 ?? NaN;
    return {
      firstRpcMs: gvisorTargets.firstRpcVsSandbox * sandbox,
      proxyRpcMs: gvisorTargets.proxyRpcMs,
      suspendResumeMs: gvisorTargets.suspendResumeMs,
    };
  }
  return { firstRpcMs: targets.firstRpcMs, proxyRpcMs: targets.proxyRpcMs };
}

const memoryNote: Record<ProviderName, string> = {
  process: "node's process",
  sandbox: "bwrap, the namespace's init and node; cgroup: the instance's memory cgroup",
  gvisor:
    "every pid in the instance's cgroup: runsc run, runsc-gofer, runsc-sandbox (the Sentry, which holds image " +
    "code's memory) and its stubs; cgroup: memory.usage_in_bytes / memory.current of that cgroup, which also " +
    "counts the Sentry's memory file pages no process maps at the moment",
};

export function printProviderResults(
  providers: readonly ProviderName[],
  results: Record<ProviderName, ProviderResults>,
  directPaths: RpcPath[],
  rpc: RpcSettings,
  comparison: ComparisonRow[],
): void {
  for (const provider of providers) {
    const r = results[provider];
    const limits = limitsOf(provider, results);
    console.log(`\n## ${provider} provider\n\nlatencies (sandbox image; p50 against the targets it is held to):\n`);
    console.log(formatLatencies(latencyRows(r.launches, r.rpc, r.suspend, r.getMicrovm, limits)));
    console.log(`\nimages (createImage checks the module in an instance of this provider; targets from issue 13):\n`);
    console.log(formatImages(r.images));
    console.log(
      `\ndensity (live instances have each answered one RPC; memory read 1 s after the last launch; PSS, VmRSS and ` +
        `anon summed over ${memoryNote[provider]}):\n`,
    );
    console.log(formatDensity(r.density));
    if (r.deaths.length) console.log(`\nprocesses that died during the run: ${r.deaths.join("; ")}`);
    if (r.densityFailures.length) console.log(`\nDENSITY NOT REACHED: ${r.densityFailures.join("; ")}`);
  }
  console.log(
    `\nRPC paths (hello("x"); sequential after 100 unmeasured, then ${rpc.callers} concurrent callers for ` +
      `${rpc.seconds} s; instance CPU summed over all its processes):\n`,
  );
  console.log(
    formatRpcPaths([
      ...providers.flatMap((p) => results[p].rpc.map((path) => ({ ...path, path: `${p}: ${path.path}` }))),
      ...directPaths,
    ]),
  );
  console.log(`\nproviders side by side, same run (ratios of the values in this table):\n`);
  console.log(formatComparison(comparison, providers));
  console.log(
    `\ntargets (issue 11: the sandbox's; issue 13: images on the sandbox; issue 23: gvisor; issue 26: gvisor's ` +
      `suspend and resume with snapshots):\n`,
  );
  const checked = verdicts(comparison);
  console.log(formatVerdicts(checked));
  const missed = checked.filter((v) => v.met !== true);
  console.log(
    missed.length
      ? `\n${missed.length} target(s) not met: ` +
          missed
            .map(
              (v) =>
                `${v.target.provider} ${v.metric.trim()} ` +
                `(#${v.target.issue}: ${v.met === undefined ? "not measured" : "missed"})`,
            )
            .join("; ")
      : `\nevery target met`,
  );
}

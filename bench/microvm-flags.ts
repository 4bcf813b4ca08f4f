// `npm run bench -- --microvm-flags`: which node flags make an instance cheaper. The sandbox
// bundle runs by hand with the process provider's command line plus each candidate set of
// flags; per set: start time, memory after one RPC and after load, RPC latency and req/s
// (raw keep-alive http, direct to the runtime) and CPU per call. Sets are interleaved within
// each round and the table shows medians over rounds, so machine drift hits all alike.
import { installShutdownHandlers } from "./children.ts";
import { directRuntimes, type DirectOptions } from "./microvm-direct.ts";
import { leftoverInstances } from "./microvm-instance-procs.ts";
import { concurrent, keepAliveAgent, rawRpc, sequential, type RawTarget } from "./microvm-http.ts";
import { cpuSeconds, memoryKiB, type MemoryKiB } from "./proc.ts";
import type { BenchRun } from "./options.ts";
import { markdownTable } from "./report.ts";
import { median, pause } from "./stats.ts";
import { saveResults } from "./results.ts";

interface Candidate {
  name: string;
  options: DirectOptions;
}

/** Each set is added to the provider's own flags (a given --max-old-space-size replaces its 256). */
export const candidates: Candidate[] = [
  { name: "floor: bare node:http script, provider's command line", options: { entry: "floor" } },
  { name: "provider default (--max-old-space-size=256, permission model)", options: {} },
  { name: "no permission model", options: { permissions: false } },
  { name: "--max-semi-space-size=1", options: { nodeFlags: ["--max-semi-space-size=1"] } },
  { name: "--v8-pool-size=0", options: { nodeFlags: ["--v8-pool-size=0"] } },
  { name: "--v8-pool-size=1", options: { nodeFlags: ["--v8-pool-size=1"] } },
  { name: "--single-threaded", options: { nodeFlags: ["--single-threaded"] } },
  { name: "--max-old-space-size=32", options: { nodeFlags: ["--max-old-space-size=32"] } },
  { name: "--optimize-for-size", options: { nodeFlags: ["--optimize-for-size"] } },
  { name: "--no-opt", options: { nodeFlags: ["--no-opt"] } },
  { name: "--lite-mode", options: { nodeFlags: ["--lite-mode"] } },
  { name: "--jitless", options: { nodeFlags: ["--jitless"] } },
  {
    name: "combo: --max-semi-space-size=1 --single-threaded --max-old-space-size=64",
    options: { nodeFlags: ["--max-semi-space-size=1", "--single-threaded", "--max-old-space-size=64"] },
  },
  {
    name: "combo + --lite-mode",
    options: { nodeFlags: ["--max-semi-space-size=1", "--single-threaded", "--max-old-space-size=64", "--lite-mode"] },
  },
  {
    name: "combo + --jitless",
    options: { nodeFlags: ["--max-semi-space-size=1", "--single-threaded", "--max-old-space-size=64", "--jitless"] },
  },
];

interface Sample {
  readyMs: number;
  afterOneRpc: MemoryKiB;
  afterLoad: MemoryKiB;
  seqP50: number;
  seqP99: number;
  rps: number;
  cpuUsPerCall: number;
}

interface FlagSettings {
  rounds: number;
  /** Starts per set per round, for the start time (only the last one is measured further). */
  starts: number;
  calls: number;
  callers: number;
  seconds: number;
}

async function measureOne(
  start: () => Promise<{ pid: number; target: RawTarget; readyMs: number; stop(): Promise<void> }>,
  settings: FlagSettings,
): Promise<Sample> {
  const readies: number[] = [];
  for (let i = 1; i < settings.starts; i++) {
    const runtime = await start();
    readies.push(runtime.readyMs);
    await runtime.stop();
  }
  const runtime = await start();
  readies.push(runtime.readyMs);
  try {
    const seqCall = rawRpc(runtime.target, keepAliveAgent(1), "hello", ["x"]);
    if ((await seqCall()) !== 200) throw new Error("first RPC failed");
    await pause(1_000);
    const afterOneRpc = memoryKiB(runtime.pid);
    const concurrentCall = rawRpc(runtime.target, keepAliveAgent(settings.callers), "hello", ["x"]);
    await concurrent(concurrentCall, settings.callers, 1); // warm-up: the JIT flags change how fast code gets hot
    const seq = await sequential(seqCall, settings.calls);
    const before = cpuSeconds(runtime.pid);
    const load = await concurrent(concurrentCall, settings.callers, settings.seconds);
    const cpuUsPerCall = Math.round(((cpuSeconds(runtime.pid) - before) * 1e6) / Math.max(1, load.requests));
    const afterLoad = memoryKiB(runtime.pid);
    return {
      readyMs: median(readies),
      afterOneRpc,
      afterLoad,
      seqP50: seq.p50,
      seqP99: seq.p99,
      rps: load.rps,
      cpuUsPerCall,
    };
  } finally {
    await runtime.stop();
  }
}

export const runMicrovmFlags: BenchRun = async (options, header, startedAt) => {
  const settings: FlagSettings = options.quick
    ? { rounds: 1, starts: 2, calls: 500, callers: 20, seconds: 1 }
    : { rounds: options.rounds, starts: 3, calls: 2_000, callers: 20, seconds: 2 };
  const direct = await directRuntimes();
  installShutdownHandlers(() => direct.close());
  const names = candidates.map((c) => c.name);
  const samples = new Map<string, Sample[]>(names.map((name) => [name, []]));
  try {
    for (let round = 1; round <= settings.rounds; round++) {
      console.log(`round ${round}/${settings.rounds}…`);
      for (const candidate of candidates) {
        const start = async () => {
          const runtime = await direct.start(candidate.options);
          return { ...runtime, target: { host: "127.0.0.1", port: runtime.port, headers: runtime.headers } };
        };
        const sample = await measureOne(start, settings);
        samples.get(candidate.name)!.push(sample);
        console.log(
          `  ${candidate.name}: ready ${sample.readyMs.toFixed(0)} ms, VmRSS ` +
            `${(sample.afterOneRpc.rss / 1024).toFixed(1)} MiB, RPC p50 ${sample.seqP50} ms, ${sample.rps} req/s`,
        );
      }
    }
  } finally {
    await direct.close();
    const left = await leftoverInstances([direct.workDir]);
    if (left.length) {
      console.error(`runtimes left after the experiment: ${left.map((p) => p.pid).join(", ")}`);
      process.exitCode = 1;
    }
  }
  console.log(
    `\nnode flags for an instance (sandbox runtime by hand, raw keep-alive RPC direct; median of ` +
      `${settings.rounds} round(s)):\n`,
  );
  console.log(formatFlags(names, samples));
  await saveResults(
    { ...header, settings, candidates, samples: Object.fromEntries(samples) },
    startedAt,
    "microvm-flags",
  );
};

function formatFlags(names: string[], samples: Map<string, Sample[]>): string {
  const mib = (kib: number) => (kib / 1024).toFixed(1);
  return markdownTable(
    [
      "flags",
      "ready ms",
      "VmRSS MiB",
      "PSS MiB",
      "anon MiB",
      "VmRSS after load",
      "anon after load",
      "RPC p50 ms",
      "RPC p99 ms",
      "req/s (20)",
      "CPU µs/call",
    ],
    names.map((name) => {
      const runs = samples.get(name)!;
      const med = (pick: (s: Sample) => number) => median(runs.map(pick));
      return [
        name,
        med((s) => s.readyMs).toFixed(0),
        mib(med((s) => s.afterOneRpc.rss)),
        mib(med((s) => s.afterOneRpc.pss)),
        mib(med((s) => s.afterOneRpc.anon)),
        mib(med((s) => s.afterLoad.rss)),
        mib(med((s) => s.afterLoad.anon)),
        med((s) => s.seqP50).toFixed(3),
        med((s) => s.seqP99).toFixed(3),
        String(Math.round(med((s) => s.rps))),
        String(Math.round(med((s) => s.cpuUsPerCall))),
      ];
    }),
  );
}

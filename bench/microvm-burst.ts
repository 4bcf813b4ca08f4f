// `npm run bench -- --microvm-burst`: a burst of launches asked at once on one host, with the
// host's boot slots (MICROVM_BOOT_SLOTS' default) and without a bound (as many slots as
// launches), taking turns within each round. Per side: how many started within the start
// timeout (25 s), when the first and the median of them answered, and when the last did.
// gVisor where runsc runs, else the bubblewrap sandbox; no service, the provider alone.
import { availableParallelism } from "node:os";
import { testImages } from "../test/images/paths.ts";
import { checkGvisor, createGvisorProvider, createSandboxProvider } from "../vm-runtime/service/index.ts";
import type { BenchRun } from "./options.ts";
import { markdownTable } from "./report.ts";
import { saveResults } from "./results.ts";
import { median } from "./stats.ts";

interface Burst {
  readonly started: number;
  readonly failed: number;
  /** Ms from the burst to each started instance's answer, ascending. */
  readonly readyMs: number[];
  readonly firstFailure?: string;
}

const sides = ["boot slots (default)", "no bound"] as const;

export const runMicrovmBurst: BenchRun = async (options, header, startedAt) => {
  const gvisor = await checkGvisor();
  const create = gvisor.ok ? createGvisorProvider : createSandboxProvider;
  const provider = gvisor.ok ? "gvisor" : "sandbox";
  if (!gvisor.ok) console.log(`gVisor not measured (${gvisor.reason}): the sandbox instead`);
  const size = options.burst;
  const rounds = options.rounds;
  console.log(
    `${size} launches at once on the ${provider} provider, ${rounds} rounds, ${availableParallelism()} cores\n`,
  );
  const results: Record<(typeof sides)[number], Burst[]> = { "boot slots (default)": [], "no bound": [] };
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? sides : [...sides].reverse();
    for (const side of order) {
      const burst = await launchBurst(create, size, side === "no bound" ? size : undefined);
      results[side].push(burst);
      console.log(
        `round ${round + 1} ${side}: ${burst.started}/${size} started, last ${burst.readyMs.at(-1) ?? "-"} ms` +
          (burst.firstFailure ? `; first failure: ${burst.firstFailure}` : ""),
      );
    }
  }
  const cell = (values: number[]) => (values.length ? String(Math.round(median(values))) : "-");
  const body = sides.map((side) => {
    const bursts = results[side];
    const started = bursts.map((b) => b.started);
    return [
      side,
      `${cell(started)}/${size}`,
      cell(bursts.flatMap((b) => (b.readyMs.length ? [b.readyMs[0]!] : []))),
      cell(bursts.flatMap((b) => (b.readyMs.length ? [median(b.readyMs)] : []))),
      cell(bursts.flatMap((b) => (b.readyMs.length ? [b.readyMs.at(-1)!] : []))),
    ];
  });
  console.log(
    `\nmedians over ${rounds} rounds\n\n${markdownTable(
      ["side", "started", "first ready ms", "median ready ms", "last ready ms"],
      body,
    )}`,
  );
  await saveResults({ ...header, provider, size, results }, startedAt, "microvm-burst");
};

async function launchBurst(
  create: typeof createGvisorProvider,
  size: number,
  bootSlots: number | undefined,
): Promise<Burst> {
  const provider = await create({
    hostKey: `bench-burst-${process.pid}`,
    warmInstances: 0,
    memoryMiB: 96,
    scratchMiB: 8,
    ...(bootSlots === undefined ? {} : { bootSlots }),
  });
  try {
    await provider.prepare([testImages.counter]);
    const began = performance.now();
    const settled = await Promise.allSettled(
      Array.from({ length: size }, async (_, i) => {
        const handle = await provider.start({ microvmId: `burst-${i}`, image: testImages.counter });
        return { handle, ms: performance.now() - began };
      }),
    );
    const started = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    const failures = settled.flatMap((s) => (s.status === "rejected" ? [s.reason as Error] : []));
    await Promise.allSettled(started.map((s) => provider.terminate(s.handle, 200)));
    return {
      started: started.length,
      failed: failures.length,
      readyMs: started.map((s) => Math.round(s.ms)).sort((a, b) => a - b),
      ...(failures[0] ? { firstFailure: `${failures[0].message}: ${String(failures[0].cause ?? "")}` } : {}),
    };
  } finally {
    await provider.close();
  }
}

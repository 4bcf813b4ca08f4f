// One measured load: the runner's result plus the peak RSS and CPU of the service and
// nats-server processes over the same span. A failing runner becomes `{ error }`.
import { sampleUsage } from "./proc-stats.ts";
import type { Outcome } from "./report.ts";
import type { LoadSettings, ProcessGroups } from "./types.ts";
import type { Runner } from "./workloads.ts";

export async function measure(run: Runner, groups: ProcessGroups, settings: LoadSettings): Promise<Outcome> {
  const sampler = sampleUsage(groups);
  try {
    const result = await run(settings);
    return { ...result, ...sampler.stop() };
  } catch (err) {
    sampler.stop();
    return { error: (err as Error)?.message ?? String(err) };
  }
}

/** Lets the previous load's stragglers and timers settle before the next one starts. */
export const pause = (ms = 500) => new Promise((resolve) => setTimeout(resolve, ms));

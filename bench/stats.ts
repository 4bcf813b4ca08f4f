// Figures over samples, shared by every bench: the median (of rounds, of runs), latency
// percentiles of samples in ms, and the pause that lets one load's stragglers settle.

export function median(values: number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** p50/p99 and mean of samples in ms. */
export interface Percentiles {
  n: number;
  p50: number;
  p99: number;
  mean: number;
}

/** Nearest-rank percentiles, rounded to the µs. */
export function percentiles(samples: number[]): Percentiles {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (p: number) =>
    sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]! : NaN;
  const mean = sorted.reduce((sum, v) => sum + v, 0) / Math.max(1, sorted.length);
  return { n: sorted.length, p50: roundMs(at(50)), p99: roundMs(at(99)), mean: roundMs(mean) };
}

export const roundMs = (ms: number) => Math.round(ms * 1000) / 1000;

/** Waits `ms`: lets the previous load's stragglers and timers settle before the next one starts. */
export const pause = (ms = 500) => new Promise((resolve) => setTimeout(resolve, ms));

// A latency and status tally shared by the HTTP and NATS load generators, so both report
// the same way: an HDR histogram in microseconds, counts per status, sampled error messages.
import { build } from "hdr-histogram-js";
import type { LoadResult } from "./types.ts";

export interface Tally {
  /** One answer with `status` after `ms` milliseconds. */
  answer(status: number, ms: number): void;
  /** One request that got no answer (socket error or timeout). */
  fail(err: unknown, timeout?: boolean): void;
  /** The result over `seconds` of load. */
  result(seconds: number): LoadResult;
}

/** An HDR histogram of latencies in µs (1 µs to 120 s, 3 significant digits). */
export const latencyHistogram = () =>
  build({
    useWebAssembly: false,
    lowestDiscernibleValue: 1,
    highestTrackableValue: 120_000_000,
    numberOfSignificantValueDigits: 3,
  });

/** `expectedStatus`: a non-2xx status that is the right answer for this workload (404). */
export function createTally(expectedStatus?: number): Tally {
  const histogram = latencyHistogram();
  const statusCodes: Record<string, number> = {};
  const errorSamples = new Set<string>();
  let requests = 0;
  let errors = 0;
  let timeouts = 0;
  return {
    answer(status, ms) {
      requests++;
      statusCodes[status] = (statusCodes[status] ?? 0) + 1;
      histogram.recordValue(Math.max(1, Math.round(ms * 1000)));
    },
    fail(err, timeout = false) {
      errors++;
      if (timeout) timeouts++;
      if (errorSamples.size < 5) errorSamples.add(err instanceof Error ? err.message : String(err));
    },
    result(seconds) {
      let expected = 0;
      let unexpected = 0;
      for (const [code, count] of Object.entries(statusCodes)) {
        const status = Number(code);
        if (status === expectedStatus) expected += count;
        else if (status < 200 || status >= 300 || expectedStatus !== undefined) unexpected += count;
      }
      const ms = (percentile: number) => (requests ? histogram.getValueAtPercentile(percentile) / 1000 : 0);
      return {
        requests,
        seconds,
        rps: seconds > 0 ? requests / seconds : 0,
        p50: ms(50),
        p99: ms(99),
        errors,
        timeouts,
        unexpected,
        expected,
        statusCodes,
        errorSamples: [...errorSamples],
      };
    },
  };
}

// Direct NATS load without HTTP: `inFlight` request loops against one subject for a fixed
// duration, counting completions and latencies the same way as the HTTP load.
import type { NatsConnection } from "@nats-io/transport-node";
import { ERROR_CODE_HEADER } from "../schemas/index.ts";
import { createTally } from "./latency.ts";
import type { LoadResult, LoadSettings } from "./types.ts";

export interface NatsLoadSpec {
  subject: string;
  /** The request body to send next (JSON text). */
  next(): string;
  expectedStatus?: number;
}

const encoder = new TextEncoder();

/** The HTTP-equivalent status of a reply: its error-code header, else 200. */
export function replyStatus(headers: { get(name: string): string } | undefined): number {
  const code = headers?.get(ERROR_CODE_HEADER);
  return code ? Number(code) : 200;
}

export async function runNatsLoad(nc: NatsConnection, spec: NatsLoadSpec, settings: LoadSettings): Promise<LoadResult> {
  const tally = createTally(spec.expectedStatus);
  const started = performance.now();
  const deadline = started + settings.duration * 1000;
  const loop = async () => {
    while (performance.now() < deadline) {
      const sent = performance.now();
      try {
        const reply = await nc.request(spec.subject, encoder.encode(spec.next()), { timeout: 10_000 });
        tally.answer(replyStatus(reply.headers), performance.now() - sent);
      } catch (err) {
        tally.fail(err, /timeout/i.test((err as Error)?.message ?? ""));
      }
    }
  };
  await Promise.all(Array.from({ length: settings.connections }, loop));
  return tally.result((performance.now() - started) / 1000);
}

/**
 * Runs `task(i)` for i in [0, count) with at most `concurrency` at once; resolves to the
 * results in order. For seeding and filling, not for measuring.
 */
export async function inPool<T>(count: number, concurrency: number, task: (i: number) => Promise<T>): Promise<T[]> {
  const results = new Array<T>(count);
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      results[i] = await task(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker));
  return results;
}

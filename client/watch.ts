// The job-created notification: a KV watch on the jobs bucket, as an async iterable.
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { bucketNames } from "../platform/index.ts";

/** A job as it was created, with its KV revision (a monotonically rising sequence). */
export interface JobCreated {
  id: string;
  content: string;
  revision: number;
}

/**
 * Yields every job created from now on (`fromStart` replays the stored ones first).
 * Works from any process connected to the same NATS; stop by breaking out of the loop.
 */
export async function* watchJobs(
  nc: NatsConnection,
  {
    fromStart = false,
    onWatching,
  }: { fromStart?: boolean /** Called once the watch is set up. */; onWatching?: () => void } = {},
): AsyncGenerator<JobCreated> {
  const kv = await new Kvm(nc).open(bucketNames.jobs);
  const watcher = await kv.watch({ include: fromStart ? "" : "updates" });
  onWatching?.();
  try {
    for await (const entry of watcher) {
      if (entry.operation !== "PUT") continue;
      const job = entry.json<{ id?: string; content?: string }>();
      yield { id: job.id ?? entry.key, content: job.content ?? "", revision: entry.revision };
    }
  } finally {
    watcher.stop();
  }
}

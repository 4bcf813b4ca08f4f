// The job-created notification: the server republishes every write of the jobs bucket on
// `jobs.created.<key>` as it stores it; a watcher subscribes there (and replays the stored jobs
// by direct gets), so it needs no JetStream consumer, and its user no right to create one.
import { jetstreamManager } from "@nats-io/jetstream";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { bucketNames, jobsCreatedSubject } from "../platform/index.ts";
import { ANONYMOUS, keyOwner } from "../schemas/index.ts";

/** A job as it was created, with its KV revision (a monotonically rising sequence). */
export interface JobCreated {
  id: string;
  content: string;
  revision: number;
  /** The principal whose job it is, when API keys are on (absent: the anonymous principal's). */
  owner?: string;
}

export interface WatchJobsOptions {
  /** Replay the stored jobs first. */
  fromStart?: boolean;
  /** Called once the watch is set up: jobs created from then on are seen. */
  onWatching?: () => void;
  /** The service's `NATS_SUBJECT_PREFIX`. */
  prefix?: string;
}

/**
 * Yields every job created from now on (`fromStart` replays the stored ones first).
 * Works from any process connected to the same NATS; stop by breaking out of the loop.
 */
export async function* watchJobs(
  nc: NatsConnection,
  { fromStart = false, onWatching, prefix = "" }: WatchJobsOptions = {},
): AsyncGenerator<JobCreated> {
  const sub = nc.subscribe(`${jobsCreatedSubject(prefix)}.>`);
  try {
    await nc.flush(); // the server knows the subscription: nothing stored from here on is missed
    onWatching?.();
    let replayed = 0;
    if (fromStart) {
      for await (const job of storedJobs(nc)) {
        replayed = job.revision;
        yield job;
      }
    }
    for await (const msg of sub) {
      const job = jobOf(msg.headers, msg.string());
      // Stored before the replay ended: already yielded.
      if (job && job.revision > replayed) yield job;
    }
  } finally {
    sub.unsubscribe();
  }
}

/** The stored jobs in order, read one by one with direct gets (no consumer). */
async function* storedJobs(nc: NatsConnection): AsyncGenerator<JobCreated> {
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  const stream = `KV_${bucketNames.jobs}`;
  for (let seq = 1; ; ) {
    const msg = await jsm.direct.getMessage(stream, { seq, next_by_subj: `$KV.${bucketNames.jobs}.>` });
    if (!msg) return;
    const job = jobOf(msg.header, msg.string(), msg.seq, msg.subject);
    if (job) yield job;
    seq = msg.seq + 1;
  }
}

/** A stored write as a created job; undefined for a delete, a purge or a record that is not JSON. */
function jobOf(
  headers: MsgHdrs | undefined,
  body: string,
  seq = Number(headers?.get("Nats-Sequence")),
  subject = headers?.get("Nats-Subject") ?? "",
): JobCreated | undefined {
  const operation = headers?.get("KV-Operation");
  if ((operation && operation !== "PUT") || !Number.isSafeInteger(seq)) return undefined;
  let job: { id?: unknown; content?: unknown };
  try {
    job = JSON.parse(body) as typeof job;
  } catch {
    return undefined;
  }
  if (typeof job !== "object" || job === null) return undefined;
  const owned = keyOwner(subject.slice(`$KV.${bucketNames.jobs}.`.length));
  if (!owned) return undefined;
  const owner = owned.principal === ANONYMOUS ? {} : { owner: owned.principal };
  return {
    id: typeof job.id === "string" ? job.id : owned.key,
    content: typeof job.content === "string" ? job.content : "",
    revision: seq,
    ...owner,
  };
}

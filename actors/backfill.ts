// The backfill of list indexes: records written before lists were read a page at a time have
// no creation marker, and task objects no directory entry. Run at start, before the actors
// serve. One pass over each paged bucket's stream, in stream order, writes every missing marker
// (create-only: a marker written already, by a run killed halfway or by an actor, stays as it
// is), then a done key: a run after it reads one key and stops; a run killed before it starts over.
import { bucketNames, markerKey, type Requester } from "../platform/index.ts";
import { headers } from "@nats-io/transport-node";

/** The key that says a bucket's markers are complete (`=v.` is no record, marker or owner key). */
export const BACKFILL_DONE_KEY = "=v.pages-1";

// Messages read per request, and marker writes in flight at once.
const READ_BATCH = 1_000;
const WRITES_IN_FLIGHT = 512;

export interface BackfillOptions {
  /** Time for one request (default 10 s). */
  timeoutMs?: number;
  /** Hears how many markers each bucket was missing (a progress report). */
  onMarkers?: (bucket: string, written: number) => void;
}

/** Writes the missing markers of the tasks and task-object buckets; returns how many were written. */
export async function backfillIndexes(requester: Requester, options: BackfillOptions = {}): Promise<number> {
  let written = 0;
  for (const bucket of [bucketNames.tasks, bucketNames.taskObjects])
    written += await backfill(requester, bucket, options);
  return written;
}

/** The markers a live key of `bucket` needs (none for a marker or done key). */
export function markersOf(bucket: string, key: string): string[] {
  const tokens = key.split(".");
  if (tokens.some((t) => t.startsWith("="))) return [];
  if (bucket === bucketNames.tasks) return tokens.length === 1 ? [markerKey("", "c", key)] : [];
  // Task objects: `<name-token>.<id>` a record, `<name-token>` the lease of an active name.
  if (tokens.length === 2) return [markerKey(`${tokens[0]}.`, "c", tokens[1]!), markerKey("", "o", tokens[0]!)];
  return tokens.length === 1 ? [markerKey("", "o", key)] : [];
}

async function backfill(requester: Requester, bucket: string, options: BackfillOptions): Promise<number> {
  const timeout = options.timeoutMs ?? 10_000;
  const root = `$KV.${bucket}.`;
  const created = headers();
  created.set("Nats-Expected-Last-Subject-Sequence", "0");
  const send = async (key: string) => {
    const ack = (await requester.request(root + key, undefined, timeout, created)).json<{
      error?: { err_code: number };
    }>();
    // 10071: the key has a last message already (written by an earlier run, or by an actor).
    if (ack.error && ack.error.err_code !== 10071)
      throw new Error(`marker ${key} of ${bucket}: ${JSON.stringify(ack.error)}`);
    return ack.error ? 0 : 1;
  };
  const done = await requester.request(
    `$JS.API.DIRECT.GET.KV_${bucket}.${root}${BACKFILL_DONE_KEY}`,
    undefined,
    timeout,
  );
  if ((done.headers?.code ?? 0) === 0) return 0;

  let written = 0;
  const wanted = new Set<string>();
  let inFlight: Promise<number>[] = [];
  for (let seq = 1; ; ) {
    const messages: { key: string; live: boolean; seq: number }[] = [];
    const end = await requester.requestMany(
      `$JS.API.DIRECT.GET.KV_${bucket}`,
      JSON.stringify({ seq, batch: READ_BATCH }),
      timeout,
      (msg) => {
        if ((msg.headers?.code ?? 0) !== 0) return true;
        const operation = msg.headers?.get("KV-Operation");
        const subject = msg.headers?.get("Nats-Subject") ?? "";
        messages.push({
          key: subject.slice(root.length),
          live: operation !== "DEL" && operation !== "PURGE",
          seq: Number(msg.headers?.get("Nats-Sequence")),
        });
        return false;
      },
    );
    for (const m of messages) {
      if (!m.live) continue;
      for (const key of markersOf(bucket, m.key)) {
        if (wanted.has(key)) continue;
        wanted.add(key);
        inFlight.push(send(key));
        if (inFlight.length >= WRITES_IN_FLIGHT) {
          for (const n of await Promise.all(inFlight)) written += n;
          inFlight = [];
        }
      }
    }
    const code = end.headers?.code ?? 0;
    if (code === 404 || messages.length === 0 || Number(end.headers?.get("Nats-Num-Pending") ?? "0") === 0) break;
    seq = messages.at(-1)!.seq + 1;
  }
  for (const n of await Promise.all(inFlight)) written += n;
  options.onMarkers?.(bucket, written);
  const ack = (await requester.request(root + BACKFILL_DONE_KEY, "", timeout)).json<{ error?: unknown }>();
  if (ack.error) throw new Error(`the done key of ${bucket}: ${JSON.stringify(ack.error)}`);
  return written;
}

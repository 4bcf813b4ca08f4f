// The backfill of list indexes: records written before lists were read from an index name no
// index entry, and task objects' names are not listed. Run at start, before the actors serve.
// One pass over each indexed bucket's stream, in stream order: a record without its entry gets
// one, then is rewritten naming it (revision-checked); every name seen is listed. Then a done
// mark in the index stream: a run after it reads one message and stops. A run killed between
// an entry and its record's rewrite leaves a stale entry (walks skip it) and the rerun writes a
// new one: nothing lost, nothing listed twice.
import {
  bucketNames,
  indexOf,
  indexStreamOf,
  JetStreamRequestError,
  recordIndex,
  recordStore,
  type RecordIndex,
  type RecordStore,
  type Requester,
} from "../platform/index.ts";
import { createIndexed } from "./pages.ts";
import { listName, nameTasksCollection } from "./task-object-directory.ts";
import { tasksCollection } from "./tasks.ts";

/** The subject of an index stream's done mark (no collection's: those end in `=c` or `=o`). */
export const backfillDoneSubject = (bucket: string): string => `idx.${bucket}.=done`;

// Messages read per request, and records indexed at once.
const READ_BATCH = 1_000;
const WRITES_IN_FLIGHT = 256;
const REWRITE_ATTEMPTS = 5;

export interface BackfillOptions {
  /** Time for one request (default 10 s). */
  timeoutMs?: number;
}

/** Indexes the earlier records of `tasks` and `taskobjects`; returns how many it indexed (names listed included). */
export async function backfillIndexes(requester: Requester, options: BackfillOptions = {}): Promise<number> {
  let written = 0;
  for (const bucket of [bucketNames.tasks, bucketNames.taskObjects])
    written += await backfill(requester, bucket, options);
  return written;
}

/** The collection a record key of `bucket` belongs to, or undefined for a key that is no indexed record. */
function collectionOf(bucket: string, key: string): string | undefined {
  const tokens = key.split(".");
  if (tokens.some((t) => t.startsWith("="))) return undefined;
  if (bucket === bucketNames.tasks) return tokens.length === 1 ? tasksCollection("") : undefined;
  return tokens.length === 2 ? nameTasksCollection(tokens[0]!) : undefined;
}

async function backfill(requester: Requester, bucket: string, options: BackfillOptions): Promise<number> {
  const timeout = options.timeoutMs ?? 10_000;
  const index = recordIndex(requester, bucket, { timeoutMs: timeout });
  const store = recordStore(requester, bucket, { timeoutMs: timeout });
  const indexApi = `$JS.API.DIRECT.GET.${indexStreamOf(bucket)}`;
  const done = await requester.request(`${indexApi}.${backfillDoneSubject(bucket)}`, undefined, timeout);
  if ((done.headers?.code ?? 0) === 0) return 0;

  const root = `$KV.${bucket}.`;
  const names = new Set<string>();
  let written = 0;
  let inFlight: Promise<number>[] = [];
  for (let seq = 1; ; ) {
    const messages: { key: string; seq: number; data: Uint8Array; live: boolean; indexed: boolean }[] = [];
    const end = await requester.requestMany(
      `$JS.API.DIRECT.GET.KV_${bucket}`,
      JSON.stringify({ seq, batch: READ_BATCH }),
      timeout,
      (msg) => {
        if ((msg.headers?.code ?? 0) !== 0) return true;
        const operation = msg.headers?.get("KV-Operation");
        messages.push({
          key: (msg.headers?.get("Nats-Subject") ?? "").slice(root.length),
          seq: Number(msg.headers?.get("Nats-Sequence")),
          data: msg.data,
          live: operation !== "DEL" && operation !== "PURGE",
          indexed: indexOf(msg) !== undefined,
        });
        return false;
      },
    );
    const code = end.headers?.code ?? 0;
    if (code !== 0 && code !== 204 && code !== 404)
      throw new JetStreamRequestError(code, 0, end.headers?.description ?? "direct get failed");
    for (const m of messages) {
      if (!m.live) continue;
      const tokens = m.key.split(".");
      if (bucket === bucketNames.taskObjects && tokens.length <= 2 && !tokens[0]!.startsWith("="))
        names.add(tokens[0]!);
      const collection = collectionOf(bucket, m.key);
      if (collection === undefined || m.indexed) continue;
      inFlight.push(indexRecord(store, index, collection, m.key, m.data, m.seq));
      if (inFlight.length >= WRITES_IN_FLIGHT) {
        for (const n of await Promise.all(inFlight)) written += n;
        inFlight = [];
      }
    }
    if (code === 404 || messages.length === 0 || Number(end.headers?.get("Nats-Num-Pending") ?? "0") === 0) break;
    seq = messages.at(-1)!.seq + 1;
  }
  for (const n of await Promise.all(inFlight)) written += n;
  for (const token of names) await listName(store, index, "", token);
  const ack = (await requester.request(backfillDoneSubject(bucket), "1", timeout)).json<{ error?: unknown }>();
  if (ack.error) throw new Error(`the done mark of ${bucket}: ${JSON.stringify(ack.error)}`);
  return written + names.size;
}

/**
 * Gives the record `key` (read at `revision` holding `data`) an entry and rewrites it naming
 * the entry; read again when another write came between. 1 when indexed here, 0 when it was
 * indexed meanwhile or is gone.
 */
async function indexRecord(
  store: RecordStore,
  index: RecordIndex,
  collection: string,
  key: string,
  data: Uint8Array,
  revision: number,
): Promise<number> {
  for (let attempt = 1; attempt <= REWRITE_ATTEMPTS; attempt++) {
    const outcome = await createIndexed(index, collection, key, async (entry) => {
      const rewritten = await store.update(key, data, revision, undefined, entry);
      return rewritten === "moved" ? "exists" : rewritten;
    });
    if (outcome !== "exists") return 1;
    const current = await store.entry(key);
    if (current === undefined || current.index !== undefined) return 0;
    data = current.value;
    revision = current.revision;
  }
  throw new Error(`record ${key} kept changing while it was indexed`);
}

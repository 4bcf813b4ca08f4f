// Record indexes: the records of a collection in creation order, read a page at a time. Each
// indexed bucket has an index stream (`INDEX_<bucket>`) with one literal subject per collection;
// an entry is a message there whose body is a record's key, and its stream sequence is the
// record's place. The record names its entry in a header (`Record-Index`) kept on every write,
// so an entry whose record is gone or names another entry is stale: skipped, then removed.
import type { StreamConfig } from "@nats-io/jetstream";
import type { Msg } from "@nats-io/transport-node";
import { JetStreamRequestError } from "./record-store.ts";
import type { Requester } from "./requester.ts";

/** The index stream of `bucket`. */
export const indexStreamOf = (bucket: string): string => `INDEX_${bucket}`;

/** The subjects of `bucket`'s index stream. */
export const indexSubjectsOf = (bucket: string): string => `idx.${bucket}.>`;

/**
 * The subject of a collection: the records under the key prefix `prefix` ("" or tokens ending
 * in "."), of kind `kind` (`c` the records created there, `o` the names of task objects). The
 * last token begins with `=`, as no record's key token does: two collections never share one.
 */
export const collectionSubject = (bucket: string, prefix: string, kind: "c" | "o" = "c"): string =>
  `idx.${bucket}.${prefix}=${kind}`;

/** The index stream's settings (limits retention, every entry kept until removed). */
export function indexStreamConfig(bucket: string, replicas = 1): Partial<StreamConfig> & { name: string } {
  return {
    name: indexStreamOf(bucket),
    subjects: [indexSubjectsOf(bucket)],
    num_replicas: replicas,
    allow_direct: true,
    max_msgs_per_subject: -1,
  };
}

/** An index entry read by a walk. */
export interface IndexEntry {
  /** Its stream sequence: the record's place in its collection. */
  readonly seq: number;
  /** The record's key. */
  readonly key: string;
  /** When it was written (ms since the epoch). */
  readonly time: number;
}

/** A page of entries, and how many of the collection come after it. */
export interface IndexPage {
  readonly entries: IndexEntry[];
  readonly pending: number;
}

export interface RecordIndex {
  readonly bucket: string;
  /** Adds an entry for `key` to the collection `subject`; its sequence. */
  add(subject: string, key: string): Promise<number>;
  /** Removes the entry at `seq` (absent already is fine). */
  remove(seq: number): Promise<void>;
  /** The first `limit` entries of `subject` after sequence `after`, in order. */
  page(subject: string, after: number, limit: number): Promise<IndexPage>;
  /** The entries `subject` holds (stale ones too, until removed). */
  count(subject: string): Promise<number>;
}

export function recordIndex(requester: Requester, bucket: string, options: { timeoutMs?: number } = {}): RecordIndex {
  const timeout = options.timeoutMs ?? 5_000;
  const stream = indexStreamOf(bucket);
  const api = `$JS.API.DIRECT.GET.${stream}`;

  const page = async (subject: string, after: number, limit: number): Promise<IndexPage> => {
    const entries: IndexEntry[] = [];
    const end = await requester.requestMany(
      api,
      JSON.stringify({ seq: after + 1, next_by_subj: subject, batch: limit }),
      timeout,
      (msg: Msg) => {
        if ((msg.headers?.code ?? 0) !== 0) return true;
        entries.push(entryOf(msg));
        return false;
      },
    );
    const code = end.headers?.code ?? 0;
    if (code === 404) return { entries, pending: 0 };
    if (code !== 204) throw new JetStreamRequestError(code, 0, end.headers?.description ?? "direct get failed");
    // The end-of-batch status says what is left after the last message sent.
    return { entries, pending: Number(end.headers?.get("Nats-Num-Pending") ?? "0") };
  };

  return {
    bucket,
    async add(subject, key) {
      const ack = (await requester.request(subject, key, timeout)).json<JsAck>();
      if (ack.error) throw new JetStreamRequestError(ack.error.code, ack.error.err_code, ack.error.description);
      return ack.seq!;
    },
    async remove(seq) {
      const msg = await requester.request(
        `$JS.API.STREAM.MSG.DELETE.${stream}`,
        JSON.stringify({ seq, no_erase: true }),
        timeout,
      );
      const reply = msg.json<{ success?: boolean; error?: JsAck["error"] }>();
      // 10057: no message at that sequence (removed already).
      if (reply.error && reply.error.err_code !== 10057)
        throw new JetStreamRequestError(reply.error.code, reply.error.err_code, reply.error.description);
    },
    page,
    async count(subject) {
      const first = await page(subject, 0, 1);
      return first.entries.length + first.pending;
    },
  };
}

interface JsAck {
  seq?: number;
  error?: { code: number; err_code: number; description: string };
}

function entryOf(msg: Msg): IndexEntry {
  const stamp = msg.headers?.get("Nats-Time-Stamp");
  return {
    seq: Number(msg.headers?.get("Nats-Sequence")),
    key: msg.string(),
    time: stamp ? Date.parse(stamp) : Date.now(),
  };
}

// Pages of a collection: the records under one key prefix `P`, listed in creation order at a
// cost of one page whatever the bucket holds. Each record `P<key>` has a creation marker
// `P=c.<key>`, written just before it and removed just after it, so the markers in stream order
// are the collection in the order its records were created, which no update moves. A removed
// marker leaves a tombstone and a note `P=d.<key>` that the server drops a second later
// (`Nats-TTL`): walks never slow down with deletes, and a count of the collection is the markers
// less the notes. `=` begins no id key, name token or owner token.
import { headers, type Msg, type MsgHdrs } from "@nats-io/transport-node";
import {
  type CreateOutcome,
  type Fence,
  isWrongLastSequence,
  JetStreamRequestError,
  type WriteOutcome,
} from "./record-store.ts";
import type { Requester } from "./requester.ts";

/** What a marker key marks: a record's creation, a deletion of the last second, a named collection. */
export type MarkerKind = "c" | "d" | "o";

/** The marker key of kind `kind` for `token` (a record's key below `prefix`, or a name token). */
export const markerKey = (prefix: string, kind: MarkerKind, token: string): string => `${prefix}=${kind}.${token}`;

/** How long a removed marker's tombstone and its deletion note stay (the server drops them then). */
export const REMOVED_MARKER_TTL = "1s";

/** A marker found by a walk: the token it marks and its stream sequence (a walk's position). */
export interface Marker {
  readonly token: string;
  readonly seq: number;
}

/** One page of markers, and whether any come after it. */
export interface MarkerPage {
  readonly markers: Marker[];
  readonly more: boolean;
}

export interface RecordPages {
  readonly bucket: string;
  /**
   * Creates the record `prefix + token` (and its marker) only if it does not exist ("exists"),
   * or, with `fence`, only while the fence key is at its revision ("exists" when it moved: the
   * caller knows the key is new).
   */
  create(prefix: string, token: string, data: string | Uint8Array, fence?: Fence): Promise<CreateOutcome>;
  /** Deletes the record `prefix + token` at `revision` ("moved" when it moved), then removes its marker. */
  delete(prefix: string, token: string, revision: number, writeId?: string): Promise<WriteOutcome>;
  /** Writes the marker of kind `kind` for `token` unless it exists. */
  mark(prefix: string, kind: MarkerKind, token: string): Promise<void>;
  /** The first `limit` markers of kind `kind` after stream sequence `after`, in stream order. */
  page(prefix: string, kind: MarkerKind, after: number, limit: number): Promise<MarkerPage>;
  /** The records the collection `prefix` holds: its creation markers less the deletions of the last second. */
  count(prefix: string): Promise<number>;
}

// A walk reads the stream from its position unfiltered (the server's cost is the messages sent)
// while the collection is dense there, and past this many messages one filtered message at a
// time: a filtered batch read costs the server a count of what matches in the rest of the stream.
const SCAN_CHUNK = 512;
const scanBudget = (limit: number) => 4 * (limit + 1) + SCAN_CHUNK;
/** Bytes one read of a walk asks for at most (the server sends fewer messages past it). */
const READ_MAX_BYTES = 1 << 20;

export function recordPages(requester: Requester, bucket: string, options: { timeoutMs?: number } = {}): RecordPages {
  const timeout = options.timeoutMs ?? 5_000;
  const root = `$KV.${bucket}.`;
  const subject = (key: string) => root + key;

  const write = async (key: string, data: string | Uint8Array | undefined, h: MsgHdrs) =>
    ackOf(await requester.request(subject(key), data, timeout, h));

  return {
    bucket,
    async create(prefix, token, data, fence) {
      // Both leave in one turn, the marker first: the stream stores them in that order. A marker
      // is never refused but for a retried create (its record then exists, or is written now).
      const marker = write(markerKey(prefix, "c", token), undefined, expectAt(0));
      const record = write(prefix + token, data, fence ? expectAt(fence.revision, subject(fence.key)) : expectAt(0));
      const [marked, outcome] = await Promise.all([marker, record]);
      // Written, but its marker was refused: one removed before (a create refused by its fence).
      if (outcome !== "moved" && marked === "moved") await restoreMarker(prefix, token);
      if (outcome !== "moved") return outcome;
      // Refused by its fence: the record was not written, nor must its marker stay.
      if (fence && marked !== "moved") await removeMarker(prefix, token);
      return "exists";
    },
    async delete(prefix, token, revision, writeId) {
      const record = expectAt(revision);
      record.set("KV-Operation", "DEL");
      if (writeId) record.set("Nats-Msg-Id", writeId);
      const outcome = await write(prefix + token, undefined, record);
      if (outcome !== "moved") await removeMarker(prefix, token);
      return outcome;
    },
    async mark(prefix, kind, token) {
      const ack = await requester.request(subject(markerKey(prefix, kind, token)), undefined, timeout, expectAt(0));
      ackOf(ack);
    },
    async page(prefix, kind, after, limit) {
      const head = root + markerKey(prefix, kind, "");
      const found: Marker[] = [];
      const take = (m: { subject: string; seq: number; removed: boolean }) => {
        const token = m.subject.slice(head.length);
        if (m.subject.startsWith(head) && !token.includes(".") && !m.removed) found.push({ token, seq: m.seq });
      };
      let next = after + 1;
      // Dense here: the stream read as it is, a chunk at a time.
      for (let scanned = 0; scanned < scanBudget(limit); ) {
        const read = await readBatch(next, SCAN_CHUNK);
        read.messages.forEach(take);
        scanned += read.messages.length;
        if (found.length > limit) return { markers: found.slice(0, limit), more: true };
        if (read.pending === 0 || read.last === undefined) return { markers: found, more: false };
        next = read.last + 1;
      }
      // Sparse: the next marker, one at a time (a filtered read of a batch costs the server a
      // count of what matches in the rest of the stream; a read of one does not).
      while (found.length <= limit) {
        const marker = await readNext(next, `${head}*`);
        if (!marker) return { markers: found, more: false };
        take(marker);
        next = marker.seq + 1;
      }
      return { markers: found.slice(0, limit), more: true };
    },
    async count(prefix) {
      // Notes first: a deletion between the reads then leaves its tombstone in the markers read
      // after; the tombstones and notes the server drops between the reads are read again.
      for (;;) {
        const notes = await matching(markerKey(prefix, "d", "*"));
        const markers = await matching(markerKey(prefix, "c", "*"));
        if ((await matching(markerKey(prefix, "d", "*"))) === notes) return markers - notes;
      }
    },
  };

  /**
   * Removes `token`'s creation marker: its note first, then its tombstone, both dropped by the
   * server a second later (the note first, so a count never reads a tombstone without its note).
   */
  async function removeMarker(prefix: string, token: string): Promise<void> {
    const note = headers();
    note.set("Nats-TTL", REMOVED_MARKER_TTL);
    const removed = headers();
    removed.set("KV-Operation", "PURGE");
    removed.set("Nats-Rollup", "sub");
    removed.set("Nats-TTL", REMOVED_MARKER_TTL);
    await Promise.all([
      write(markerKey(prefix, "d", token), undefined, note),
      write(markerKey(prefix, "c", token), undefined, removed),
    ]);
  }

  /** Writes `token`'s creation marker again where its last write removed it. */
  async function restoreMarker(prefix: string, token: string): Promise<void> {
    const key = markerKey(prefix, "c", token);
    const last = await requester.request(`$JS.API.DIRECT.GET.KV_${bucket}.${subject(key)}`, undefined, timeout);
    const operation = last.headers?.get("KV-Operation");
    if (operation !== "PURGE" && operation !== "DEL") return;
    await write(key, undefined, expectAt(Number(last.headers?.get("Nats-Sequence"))));
  }

  /** How many messages match `filter` (server-side: a pass over the subjects it matches). */
  async function matching(filter: string): Promise<number> {
    const read = await readBatch(0, 1, root + filter);
    return read.messages.length + read.pending;
  }

  /** The first message matching `filter` from `seq` on, or undefined when there is none. */
  async function readNext(seq: number, filter: string) {
    const msg = await requester.request(
      `$JS.API.DIRECT.GET.KV_${bucket}`,
      JSON.stringify({ seq, next_by_subj: filter }),
      timeout,
    );
    const code = msg.headers?.code ?? 0;
    if (code === 404) return undefined;
    if (code !== 0) throw new JetStreamRequestError(code, 0, msg.headers?.description ?? "direct get failed");
    return messageOf(msg);
  }

  /**
   * One batch read from `seq` (`filter`: a subject filter, else every message): the messages
   * with their subject and sequence, the last one's sequence and how many are left after it.
   */
  async function readBatch(seq: number, batch: number, filter?: string) {
    const messages: { subject: string; seq: number; removed: boolean }[] = [];
    const request = {
      seq: Math.max(seq, 1),
      batch,
      max_bytes: READ_MAX_BYTES,
      ...(filter && { next_by_subj: filter }),
    };
    const end = await requester.requestMany(
      `$JS.API.DIRECT.GET.KV_${bucket}`,
      JSON.stringify(request),
      timeout,
      (msg: Msg) => {
        if ((msg.headers?.code ?? 0) !== 0) return true;
        messages.push(messageOf(msg));
        return false;
      },
    );
    const code = end.headers?.code ?? 0;
    if (code === 404) return { messages, pending: 0, last: undefined };
    if (code !== 204) throw new JetStreamRequestError(code, 0, end.headers?.description ?? "direct get failed");
    const pending = Number(end.headers?.get("Nats-Num-Pending") ?? "0");
    return { messages, pending, last: messages.at(-1)?.seq };
  }
}

/** A direct get's message: its subject, sequence, and whether it removes its key. */
function messageOf(msg: Msg) {
  const operation = msg.headers?.get("KV-Operation");
  return {
    subject: msg.headers?.get("Nats-Subject") ?? "",
    seq: Number(msg.headers?.get("Nats-Sequence")),
    removed: operation === "DEL" || operation === "PURGE",
  };
}

/** Headers expecting the last sequence of `on` (default: the message's own subject) to be `seq`. */
function expectAt(seq: number, on?: string): MsgHdrs {
  const h = headers();
  h.set("Nats-Expected-Last-Subject-Sequence", String(seq));
  if (on) h.set("Nats-Expected-Last-Subject-Sequence-Subject", on);
  return h;
}

/** JetStream's "duplicate message id is in process" (a repeat still being stored): the key moved. */
const DUPLICATE_IN_PROCESS = 10158;

/** A write's sequence from its ack; "moved" when an expected sequence was not the key's; other failures throw. */
function ackOf(msg: Msg): { revision: number } | "moved" {
  const ack = msg.json<{ seq?: number; error?: { code: number; err_code: number; description: string } }>();
  if (!ack.error) return { revision: ack.seq ?? 0 };
  if (isWrongLastSequence(ack.error.err_code) || ack.error.err_code === DUPLICATE_IN_PROCESS) return "moved";
  throw new JetStreamRequestError(ack.error.code, ack.error.err_code, ack.error.description);
}

// Records in a KV bucket through the lean requester: direct gets, create-only writes and
// revision-checked deletes, speaking the KV wire format (`$KV.<bucket>.<key>` in stream
// `KV_<bucket>`), so any KV client sees the same data.
import { headers, type Msg, type MsgHdrs } from "@nats-io/transport-node";
import { NoRespondersError, type Requester } from "./requester.ts";

/** Outcome of a create: written (at this revision), or the key held a record already. */
export type CreateOutcome = { readonly revision: number } | "exists";

/** Outcome of a write fenced by another key: written (at this revision), or "refused" when that key moved. */
export type FencedOutcome = { readonly revision: number } | "refused";

/** A key of the same bucket a write is conditional on, and the revision it must still be at. */
export interface Fence {
  readonly key: string;
  readonly revision: number;
}

/** Outcome of a revision-checked write: done (at this revision), or the key is no longer at the expected one. */
export type WriteOutcome = { readonly revision: number } | "moved";

/** A key's record and its revision (the stream sequence of its last write). */
export interface StoredEntry {
  readonly value: Uint8Array;
  readonly revision: number;
  /** The write id (`Nats-Msg-Id`) its last write was sent with, if any. */
  readonly writtenBy?: string;
  /** Its index entry's sequence (`Record-Index`), on an indexed record. */
  readonly index?: number;
}

/** A key's last write, a deletion included. */
export interface LastWrite {
  readonly revision: number;
  readonly deleted: boolean;
  readonly writtenBy?: string;
  /** The index entry its record names (`Record-Index`), if any. */
  readonly index?: number;
}

export interface RecordStore {
  readonly bucket: string;
  /** The record's bytes, or `undefined` when the key is absent or deleted. */
  get(key: string): Promise<Uint8Array | undefined>;
  /** The record and its revision, or `undefined` when the key is absent or deleted. */
  entry(key: string): Promise<StoredEntry | undefined>;
  /**
   * Writes only if the key is new (the server checks: last subject sequence must be 0). `index`:
   * the record's index entry, named in its `Record-Index` header (as in every write below).
   */
  create(key: string, data: string | Uint8Array, index?: number): Promise<CreateOutcome>;
  /**
   * Writes the record `key` only while `fence.key` is still at `fence.revision` (the server
   * checks the fence key's last sequence instead of this key's: nats-server 2.12+,
   * `Nats-Expected-Last-Subject-Sequence-Subject`); "refused" when it moved. Nothing checks that
   * `key` is new: the caller must know no write of it was ever sent (its own fresh id, on the
   * request's first attempt).
   */
  createFenced(key: string, data: string | Uint8Array, fence: Fence, index?: number): Promise<FencedOutcome>;
  /** The key's last write (a deletion too), or `undefined` when it never held anything. */
  lastWrite(key: string): Promise<LastWrite | undefined>;
  /**
   * Replaces the record only if the key is still at `revision` (the server checks). `writeId`
   * goes with the write (`Nats-Msg-Id`): a repeat of the same request finds it in `writtenBy`.
   */
  update(
    key: string,
    data: string | Uint8Array,
    revision: number,
    writeId?: string,
    index?: number,
  ): Promise<WriteOutcome>;
  /** Deletes the record only if the key is still at `revision` (the server checks), as `update` writes. */
  delete(key: string, revision: number, writeId?: string): Promise<WriteOutcome>;
}

export interface RecordStoreOptions {
  /** Time for one KV request (default 5 s). */
  timeoutMs?: number;
  /**
   * Replicas of the bucket. With more than one, a direct get may be served by a replica
   * that has not applied a write yet, so a miss is confirmed by the stream leader.
   */
  replicas?: number;
}

/** A JetStream API failure (e.g. JetStream unavailable) with its code. */
export class JetStreamRequestError extends Error {
  override readonly name = "JetStreamRequestError";
  constructor(
    readonly code: number,
    readonly errCode: number,
    description: string,
  ) {
    super(description);
  }
}

/**
 * JetStream's "wrong last sequence" error codes: the key is at another revision. nats-server
 * 2.15 answers 10164 (no sequence in the text) on a replicated stream when another write to the
 * key is still in flight, where 2.10 answered 10071.
 */
const WRONG_LAST_SEQUENCE = new Set([10071, 10164]);

/** Whether a write's ack error is a lost compare-and-set (the expected revision was not the key's). */
export const isWrongLastSequence = (errCode: number | undefined): boolean =>
  errCode !== undefined && WRONG_LAST_SEQUENCE.has(errCode);
/**
 * JetStream's "duplicate message id is in process": a write with the same write id
 * (`Nats-Msg-Id`, a repeat of the same request) is still being stored, on a replicated stream.
 * For a revision-checked write it means what a moved revision means: read again, and the
 * repeat then finds its own write (`writtenBy`) once it is stored.
 */
const DUPLICATE_IN_PROCESS = 10158;
// JetStream's "no message found" error code of a stream message get.
const NO_MESSAGE_FOUND = 10037;
// JetStream's "stream not found": the bucket was never created, so it holds no record.
const STREAM_NOT_FOUND = 10059;

/** A key's last message as the stream leader holds it; `value` is absent for a delete or purge. */
export interface LeaderEntry {
  readonly revision: number;
  readonly value?: Uint8Array;
  /** When the server stored that message (epoch ms, the server's clock). */
  readonly time?: number;
}

/**
 * A stream message get of `key`'s last message, answered by the leader: consistent after any
 * acknowledged write. Undefined when the key (or the bucket) never held anything.
 */
export async function leaderEntry(
  requester: Requester,
  bucket: string,
  key: string,
  timeoutMs: number,
): Promise<LeaderEntry | undefined> {
  const msg = await requester.request(
    `$JS.API.STREAM.MSG.GET.KV_${bucket}`,
    JSON.stringify({ last_by_subj: `$KV.${bucket}.${key}` }),
    timeoutMs,
  );
  const reply = msg.json<{
    message?: { seq: number; data?: string; hdrs?: string; time?: string };
    error?: { code: number; err_code: number; description: string };
  }>();
  if (reply.error?.err_code === NO_MESSAGE_FOUND || reply.error?.err_code === STREAM_NOT_FOUND) return undefined;
  if (reply.error || !reply.message) {
    throw new JetStreamRequestError(
      reply.error?.code ?? 500,
      reply.error?.err_code ?? 0,
      reply.error?.description ?? "no message in reply",
    );
  }
  const hdrs = reply.message.hdrs ? Buffer.from(reply.message.hdrs, "base64").toString() : "";
  const stamped = reply.message.time === undefined ? Number.NaN : Date.parse(reply.message.time);
  const at = { revision: reply.message.seq, ...(Number.isNaN(stamped) ? {} : { time: stamped }) };
  if (/KV-Operation:\s*(DEL|PURGE)/i.test(hdrs)) return at;
  return { ...at, value: Buffer.from(reply.message.data ?? "", "base64") };
}

/** Peers heard from within this long count toward the leader's majority (elections wait 4-9 s). */
const IN_TOUCH_NS = 2_500_000_000;

/**
 * Whether the stream's leader heard from a majority of its group (itself included) within
 * `IN_TOUCH_NS`: before any other peer can have been elected, so its reads are current.
 */
export async function leaderInTouch(requester: Requester, bucket: string, timeoutMs: number): Promise<boolean> {
  const msg = await requester.request(`$JS.API.STREAM.INFO.KV_${bucket}`, undefined, timeoutMs);
  const info = msg.json<StreamInfoReply>();
  if (info.error) throw new JetStreamRequestError(info.error.code, info.error.err_code, info.error.description);
  return inTouch(info);
}

/** What the stream info reply says of a stream's cluster and state (or its error). */
export interface StreamInfoReply {
  cluster?: { replicas?: { current?: boolean; offline?: boolean; active?: number }[] };
  state?: { last_seq?: number };
  error?: { code: number; err_code: number; description: string };
}

// Direct gets of one stream's last messages are gathered over an event-loop turn: the keys asked
// for in one turn go out as one batch request (`multi_last`, nats-server 2.11+) instead of a
// request each, and a lone key as the plain direct get it always was. Under load most reads of
// a turn share a request and its end-of-batch answer; a key that is not there costs no message
// of its own.
/** Most subjects in one batch request. */
export const DIRECT_BATCH_MAX = 256;

/** A subject's last message, or undefined when it has none. */
export type DirectGet = (subject: string) => Promise<Msg | undefined>;

interface Waiter {
  resolve(msg: Msg | undefined): void;
  reject(err: unknown): void;
}

/**
 * Direct gets of `stream`. Fails like a single direct get: `NoRespondersError` when the stream
 * takes no direct gets, a `JetStreamRequestError` for an error answer, a timeout.
 */
export function directGets(requester: Requester, stream: string, timeoutMs: number): DirectGet {
  const api = `$JS.API.DIRECT.GET.${stream}`;
  let queued = new Map<string, Waiter[]>();

  /** One subject, as the plain direct get (`$JS.API.DIRECT.GET.<stream>.<subject>`). */
  const single = async (subject: string): Promise<Msg | undefined> => {
    const msg = await requester.request(`${api}.${subject}`, undefined, timeoutMs);
    const code = msg.headers?.code ?? 0;
    if (code === 404) return undefined;
    if (code >= 400) throw new JetStreamRequestError(code, 0, msg.headers?.description ?? "direct get failed");
    return msg;
  };

  /**
   * Several subjects in one request: each found one answers with its message (`Nats-Subject`
   * names it), then an end-of-batch status (204), or only a 404 when none has any. A subject
   * the answer did not cover (a batch cut short, an error) is asked for alone.
   */
  const batch = async (subjects: string[]): Promise<Map<string, Msg | undefined>> => {
    const found = new Map<string, Msg | undefined>();
    const end = await requester.requestMany(
      api,
      JSON.stringify({ multi_last: subjects, batch: subjects.length }),
      timeoutMs,
      (msg) => {
        const code = msg.headers?.code ?? 0;
        if (code !== 0) return true;
        const subject = msg.headers?.get("Nats-Subject");
        if (subject) found.set(subject, msg);
        return false;
      },
    );
    const code = end.headers?.code ?? 0;
    const complete = code === 404 || (code === 204 && Number(end.headers?.get("Nats-Num-Pending") ?? "0") === 0);
    const unanswered = subjects.filter((subject) => !found.has(subject));
    if (complete) for (const subject of unanswered) found.set(subject, undefined);
    else await Promise.all(unanswered.map(async (subject) => found.set(subject, await single(subject))));
    return found;
  };

  const send = () => {
    const turn = queued;
    queued = new Map();
    const subjects = [...turn.keys()];
    for (let at = 0; at < subjects.length; at += DIRECT_BATCH_MAX) {
      const part = subjects.slice(at, at + DIRECT_BATCH_MAX);
      const answered = part.length === 1 ? single(part[0]!).then((msg) => new Map([[part[0]!, msg]])) : batch(part);
      answered.then(
        (results) => {
          for (const subject of part) for (const waiter of turn.get(subject)!) waiter.resolve(results.get(subject));
        },
        (err: unknown) => {
          for (const subject of part) for (const waiter of turn.get(subject)!) waiter.reject(err);
        },
      );
    }
  };

  return (subject) =>
    new Promise((resolve, reject) => {
      if (queued.size === 0) requester.beforeFlush(send);
      const waiters = queued.get(subject);
      if (waiters) waiters.push({ resolve, reject });
      else queued.set(subject, [{ resolve, reject }]);
    });
}

/** Whether the leader that answered `info` heard from a majority lately (always, unreplicated). */
export function inTouch(info: StreamInfoReply): boolean {
  const peers = info.cluster?.replicas ?? [];
  const heard = peers.filter((peer) => !peer.offline && (peer.active ?? Number.POSITIVE_INFINITY) < IN_TOUCH_NS);
  return (1 + heard.length) * 2 > peers.length + 1;
}

/** The header of a record's write naming its index entry (record-index.ts: the entry's stream sequence). */
export const RECORD_INDEX_HEADER = "Record-Index";

/** The index entry a record's message names (`Record-Index`), if any. */
export function indexOf(msg: Msg): number | undefined {
  const value = msg.headers?.get(RECORD_INDEX_HEADER);
  return value ? Number(value) : undefined;
}

/** Fence headers kept per key (see `recordStore`'s `fenceHeaders`). */
const MAX_FENCE_HEADERS = 10_000;

export function recordStore(requester: Requester, bucket: string, options: RecordStoreOptions = {}): RecordStore {
  const timeout = options.timeoutMs ?? 5_000;
  const stream = `KV_${bucket}`;
  const subjectOf = (key: string) => `$KV.${bucket}.${key}`;
  const createHeaders = headers();
  createHeaders.set("Nats-Expected-Last-Subject-Sequence", "0");
  // A fence's headers change only when its key is written (a lease renewal, seconds apart):
  // made once per key and revision, as `createHeaders` is once, not per write.
  const fences = new Map<string, { readonly revision: number; readonly headers: MsgHdrs }>();
  const fenceHeaders = (fence: Fence): MsgHdrs => {
    const made = fences.get(fence.key);
    if (made?.revision === fence.revision) return made.headers;
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(fence.revision));
    h.set("Nats-Expected-Last-Subject-Sequence-Subject", subjectOf(fence.key));
    // Bounded: at most the names written to lately (an owner's leases), cleared past that.
    if (fences.size >= MAX_FENCE_HEADERS) fences.clear();
    fences.set(fence.key, { revision: fence.revision, headers: h });
    return h;
  };
  const directGet = directGets(requester, stream, timeout);

  // A leader cut off from its peers answers as leader until it notices (10-20 s), while the
  // others elect a new one and take writes: its "not found" is confirmed only while it heard
  // from a majority within less than the shortest election timeout.
  const confirmedMiss = async (key: string) => {
    const found = asLastWrite(await leaderEntry(requester, bucket, key, timeout));
    if (found === undefined && !(await leaderInTouch(requester, bucket, timeout)))
      throw new JetStreamRequestError(503, 0, "the stream leader lost touch with its peers: a miss is not confirmed");
    return found;
  };
  const writeHeaders = (revision: number, writeId: string | undefined, operation?: string, index?: number) => {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(revision));
    if (writeId) h.set("Nats-Msg-Id", writeId);
    if (operation) h.set("KV-Operation", operation);
    if (index !== undefined) h.set(RECORD_INDEX_HEADER, String(index));
    return h;
  };
  /** `base` with the record's index entry named, when it has one. */
  const indexed = (base: MsgHdrs, index: number | undefined): MsgHdrs => {
    if (index === undefined) return base;
    const h = headers();
    for (const [name, values] of base) for (const value of values) h.append(name, value);
    h.set(RECORD_INDEX_HEADER, String(index));
    return h;
  };

  /** The key's last message by direct get: a record, a deletion, or undefined when none was found. */
  const lastMessage = async (key: string): Promise<(LastWrite & { value?: Uint8Array }) | undefined> => {
    let msg;
    try {
      msg = await directGet(subjectOf(key));
    } catch (err) {
      // A stream without direct gets enabled has nobody on the direct subject.
      if (err instanceof NoRespondersError) return asLastWrite(await leaderEntry(requester, bucket, key, timeout));
      throw err;
    }
    if (msg === undefined) return (options.replicas ?? 1) > 1 ? confirmedMiss(key) : undefined;
    const operation = msg.headers?.get("KV-Operation");
    const deleted = operation === "DEL" || operation === "PURGE";
    const revision = Number(msg.headers?.get("Nats-Sequence"));
    const writtenBy = msg.headers?.get("Nats-Msg-Id") || undefined;
    const index = indexOf(msg);
    return { revision, deleted, writtenBy, index, ...(deleted ? {} : { value: msg.data }) };
  };
  const entry = async (key: string): Promise<StoredEntry | undefined> => {
    const last = await lastMessage(key);
    return last?.value === undefined
      ? undefined
      : { value: last.value, revision: last.revision, writtenBy: last.writtenBy, index: last.index };
  };

  return {
    bucket,
    get: async (key) => (await entry(key))?.value,
    entry,
    async lastWrite(key) {
      const last = await lastMessage(key);
      return last && { revision: last.revision, deleted: last.deleted, writtenBy: last.writtenBy, index: last.index };
    },
    async create(key, data, index) {
      return stored(await requester.request(subjectOf(key), data, timeout, indexed(createHeaders, index))) ?? "exists";
    },
    async createFenced(key, data, fence, index) {
      const h = indexed(fenceHeaders(fence), index);
      return stored(await requester.request(subjectOf(key), data, timeout, h)) ?? "refused";
    },
    async update(key, data, revision, writeId, index) {
      const h = writeHeaders(revision, writeId, undefined, index);
      const ack = await requester.request(subjectOf(key), data, timeout, h);
      return stored(ack, DUPLICATE_IN_PROCESS) ?? "moved";
    },
    async delete(key, revision, writeId) {
      const ack = await requester.request(subjectOf(key), undefined, timeout, writeHeaders(revision, writeId, "DEL"));
      return stored(ack, DUPLICATE_IN_PROCESS) ?? "moved";
    },
  };
}

/**
 * A write's revision from its ack, or undefined when refused for its expected revision (or for
 * `alsoRefused`, an error code that means the same to the caller); other failures throw.
 */
function stored(msg: { json<T>(): T }, alsoRefused?: number): { revision: number } | undefined {
  const ack = msg.json<{ seq?: number; error?: { code: number; err_code: number; description: string } }>();
  if (!ack.error) return { revision: ack.seq ?? 0 };
  if (isWrongLastSequence(ack.error.err_code) || ack.error.err_code === alsoRefused) return undefined;
  throw new JetStreamRequestError(ack.error.code, ack.error.err_code, ack.error.description);
}

/** A leader's entry as a last write (the leader's answer carries no write id). */
function asLastWrite(entry: LeaderEntry | undefined): (LastWrite & { value?: Uint8Array }) | undefined {
  if (!entry) return undefined;
  return { revision: entry.revision, deleted: entry.value === undefined, value: entry.value };
}

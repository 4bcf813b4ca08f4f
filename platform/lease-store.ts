// Revision-checked keys in a KV bucket, for leases: leader reads that carry the revision, and
// writes and deletes that the server applies only at an expected revision (compare-and-set).
// Wire-level like record-store.ts, so any KV client sees the same keys. A lease write can
// carry writes to other keys of its bucket: one atomic batch, stored all or none.
import { randomUUID } from "node:crypto";
import { headers } from "@nats-io/transport-node";
import {
  bucketKeys,
  headersOf,
  type KeyWrite,
  isWrongLastSequence,
  JetStreamRequestError,
  leaderEntry,
  type LeaderEntry,
} from "./record-store.ts";
import { log } from "./log.ts";
import type { Requester } from "./requester.ts";

/** A key as the stream leader holds it: revision 0 = never written; no value = deleted. */
export type VersionedEntry = LeaderEntry;

/** The key moved past the expected revision: someone else wrote it. */
export const CONFLICT = "conflict" as const;

/**
 * A batch was not stored: the key moved, a write it carried failed its own check, or the
 * stream takes no atomic batches. Which one, a lone write of each tells.
 */
export const REFUSED = "refused" as const;

/** A stored batch: the key's new revision, and those of the writes it carried, in order. */
export interface CarriedOutcome {
  readonly revision: number;
  readonly carried: readonly number[];
}

/** Writes one batch may carry besides its key's own (the server stores up to 1,000 messages at once). */
export const MAX_CARRIED = 256;

export interface VersionedStore {
  readonly bucket: string;
  /** The latest entry of `key`, read from the stream leader (never a lagging replica). */
  get(key: string): Promise<VersionedEntry>;
  /** Writes `value` if the key is still at `revision`; resolves with the new revision. */
  put(key: string, value: string, revision: number): Promise<number | typeof CONFLICT>;
  /**
   * Writes `value` if the key is still at `revision`, and `carried` (writes to other keys of the
   * bucket, each with its own check) in the same atomic batch: all are stored, or none.
   */
  putCarrying(
    key: string,
    value: string,
    revision: number,
    carried: readonly KeyWrite[],
  ): Promise<CarriedOutcome | typeof REFUSED>;
  /** Deletes the key if it is still at `revision`. */
  delete(key: string, revision: number): Promise<number | typeof CONFLICT>;
  /** Every key starting with `prefix` ever written (deleted ones too), sorted (`bucketKeys`). */
  keys(prefix?: string): Promise<string[]>;
}

export function versionedStore(requester: Requester, bucket: string, timeoutMs = 2_000): VersionedStore {
  const subjectOf = (key: string) => `$KV.${bucket}.${key}`;

  async function write(key: string, value: string, revision: number, operation?: "DEL") {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(revision));
    if (operation) h.set("KV-Operation", operation);
    const msg = await requester.request(subjectOf(key), value, timeoutMs, h);
    const ack = msg.json<{ seq?: number; error?: { code: number; err_code: number; description: string } }>();
    if (isWrongLastSequence(ack.error?.err_code)) return CONFLICT;
    if (ack.error || ack.seq === undefined) {
      throw new JetStreamRequestError(
        ack.error?.code ?? 500,
        ack.error?.err_code ?? 0,
        ack.error?.description ?? "no sequence in ack",
      );
    }
    return ack.seq;
  }

  // Cleared when the stream answers that it takes no atomic batches (`allow_atomic` off).
  let atomic = true;

  async function putCarrying(key: string, value: string, revision: number, carried: readonly KeyWrite[]) {
    if (!atomic) return REFUSED;
    if (carried.length > MAX_CARRIED) throw new RangeError(`a batch carries at most ${MAX_CARRIED} writes`);
    const batch = randomUUID();
    const messages = [
      { key, data: value, checks: { "Nats-Expected-Last-Subject-Sequence": String(revision) } },
      ...carried.map((write) => {
        if (write.bucket !== bucket) throw new RangeError(`a write to ${write.bucket} in a batch of ${bucket}`);
        return { key: write.key, data: write.data, checks: write.headers };
      }),
    ];
    const last = messages.length - 1;
    // Nothing stored if one is lost: the server refuses a batch with a gap at its commit.
    messages.slice(0, last).forEach((m, i) => {
      requester.send(subjectOf(m.key), m.data, batchHeaders(m.checks, batch, i + 1));
    });
    const commit = messages[last]!;
    const msg = await requester.request(
      subjectOf(commit.key),
      commit.data,
      timeoutMs,
      batchHeaders(commit.checks, batch, last + 1, true),
    );
    const ack = msg.json<{
      seq?: number;
      count?: number;
      error?: { code: number; err_code: number; description: string };
    }>();
    if (ack.error?.err_code === ATOMIC_PUBLISH_DISABLED && atomic) {
      atomic = false;
      log.warn(
        { bucket },
        "the bucket's stream takes no atomic batches (allow_atomic): each write goes after its own fence",
      );
    }
    // A 400 refuses the batch as a whole, as does a stream with its most batches in flight
    // (50): a lone write of each says why, or goes through.
    if (ack.error?.code === 400 || ack.error?.err_code === TOO_MANY_IN_FLIGHT) return REFUSED;
    if (ack.error || ack.seq === undefined || ack.count !== messages.length) {
      throw new JetStreamRequestError(
        ack.error?.code ?? 500,
        ack.error?.err_code ?? 0,
        ack.error?.description ?? `batch ack for ${ack.count} of ${messages.length} messages`,
      );
    }
    // A batch is stored in order, at consecutive sequences ending at the ack's.
    const first = ack.seq - last;
    return { revision: first, carried: carried.map((_, i) => first + 1 + i) };
  }

  return {
    bucket,
    putCarrying,
    get: async (key) => (await leaderEntry(requester, bucket, key, timeoutMs)) ?? { revision: 0 },
    put: (key, value, revision) => write(key, value, revision),
    delete: (key, revision) => write(key, "", revision, "DEL"),
    keys: (prefix = "") => bucketKeys(requester, bucket, prefix, timeoutMs),
  };
}

// JetStream's "atomic publish is disabled": the stream was made without `allow_atomic`.
const ATOMIC_PUBLISH_DISABLED = 10174;
// JetStream's "atomic publish too many inflight" (429): the stream or server has its most batches open.
const TOO_MANY_IN_FLIGHT = 10210;

/** A batch member's headers: its own checks, the batch id and its place, the last one's commit. */
function batchHeaders(checks: Readonly<Record<string, string>>, batch: string, sequence: number, commit = false) {
  const h = headersOf(checks);
  h.set("Nats-Batch-Id", batch);
  h.set("Nats-Batch-Sequence", String(sequence));
  if (commit) h.set("Nats-Batch-Commit", "1");
  return h;
}

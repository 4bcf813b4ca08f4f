// Revision-checked keys in a KV bucket, for leases: leader reads that carry the revision, and
// writes and deletes that the server applies only at an expected revision (compare-and-set).
// Wire-level like record-store.ts, so any KV client sees the same keys.
import { headers } from "@nats-io/transport-node";
import { isWrongLastSequence, JetStreamRequestError, leaderEntry, type LeaderEntry } from "./record-store.ts";
import { log } from "./log.ts";
import type { Requester } from "./requester.ts";

/** A key as the stream leader holds it: revision 0 = never written; no value = deleted. */
export type VersionedEntry = LeaderEntry;

/** The key moved past the expected revision: someone else wrote it. */
export const CONFLICT = "conflict" as const;

export interface VersionedStore {
  readonly bucket: string;
  /** The latest entry of `key`, read from the stream leader (never a lagging replica). */
  get(key: string): Promise<VersionedEntry>;
  /** Writes `value` if the key is still at `revision`; resolves with the new revision. */
  put(key: string, value: string, revision: number): Promise<number | typeof CONFLICT>;
  /** Deletes the key if it is still at `revision`. */
  delete(key: string, revision: number): Promise<number | typeof CONFLICT>;
}

export function versionedStore(requester: Requester, bucket: string, timeoutMs = 2_000): VersionedStore {
  const subjectOf = (key: string) => `$KV.${bucket}.${key}`;

  async function write(key: string, value: string, revision: number, operation?: "DEL") {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(revision));
    if (operation) h.set("KV-Operation", operation);
    const msg = await requester.request(subjectOf(key), value, timeoutMs, h);
    const ack = msg.json<{ seq?: number; error?: { code: number; err_code: number; description: string } }>();
    if (isWrongLastSequence(ack.error?.err_code)) {
      log.debug(
        { bucket, key, revision, errCode: ack.error?.err_code, description: ack.error?.description },
        "lease write refused",
      );
      return CONFLICT;
    }
    if (ack.error || ack.seq === undefined) {
      throw new JetStreamRequestError(
        ack.error?.code ?? 500,
        ack.error?.err_code ?? 0,
        ack.error?.description ?? "no sequence in ack",
      );
    }
    return ack.seq;
  }

  return {
    bucket,
    get: async (key) => (await leaderEntry(requester, bucket, key, timeoutMs)) ?? { revision: 0 },
    put: (key, value, revision) => write(key, value, revision),
    delete: (key, revision) => write(key, "", revision, "DEL"),
  };
}

// Revision-checked keys in a KV bucket, for leases: leader reads that carry the revision, and
// writes and deletes that the server applies only at an expected revision (compare-and-set).
// Wire-level like record-store.ts, so any KV client sees the same keys.
import { headers } from "@nats-io/transport-node";
import { JetStreamRequestError } from "./record-store.ts";
import type { Requester } from "./requester.ts";

/** A key as the stream leader holds it: revision 0 = never written; no value = deleted. */
export interface VersionedEntry {
  readonly revision: number;
  readonly value?: Uint8Array;
}

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

// JetStream's "wrong last sequence" error code: the key is at another revision.
const WRONG_LAST_SEQUENCE = 10071;
const NO_MESSAGE_FOUND = 10037;

interface JsError {
  code: number;
  err_code: number;
  description: string;
}

export function versionedStore(requester: Requester, bucket: string, timeoutMs = 2_000): VersionedStore {
  const stream = `KV_${bucket}`;
  const subjectOf = (key: string) => `$KV.${bucket}.${key}`;

  async function write(key: string, value: string, revision: number, operation?: "DEL") {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", String(revision));
    if (operation) h.set("KV-Operation", operation);
    const msg = await requester.request(subjectOf(key), value, timeoutMs, h);
    const ack = msg.json<{ seq?: number; error?: JsError }>();
    if (ack.error?.err_code === WRONG_LAST_SEQUENCE) return CONFLICT;
    if (ack.error || ack.seq === undefined) {
      throw new JetStreamRequestError(ack.error?.code ?? 500, ack.error?.err_code ?? 0, ack.error?.description ?? "no sequence in ack");
    }
    return ack.seq;
  }

  return {
    bucket,
    async get(key) {
      const msg = await requester.request(`$JS.API.STREAM.MSG.GET.${stream}`, JSON.stringify({ last_by_subj: subjectOf(key) }), timeoutMs);
      const reply = msg.json<{ message?: { seq: number; data?: string; hdrs?: string }; error?: JsError }>();
      if (reply.error?.err_code === NO_MESSAGE_FOUND) return { revision: 0 };
      if (reply.error || !reply.message) {
        throw new JetStreamRequestError(reply.error?.code ?? 500, reply.error?.err_code ?? 0, reply.error?.description ?? "no message in reply");
      }
      const hdrs = reply.message.hdrs ? Buffer.from(reply.message.hdrs, "base64").toString() : "";
      if (/KV-Operation:\s*(DEL|PURGE)/i.test(hdrs)) return { revision: reply.message.seq };
      return { revision: reply.message.seq, value: Buffer.from(reply.message.data ?? "", "base64") };
    },
    put: (key, value, revision) => write(key, value, revision),
    delete: (key, revision) => write(key, "", revision, "DEL"),
  };
}

// Immutable records in KV: read one, create one exactly once (compare-and-set on "absent").
import type { KV } from "@nats-io/kv";
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import { IdempotencyKeyReused } from "../schemas/index.ts";

/** The stored JSON of `key`, or `undefined` when absent (or deleted). */
export async function readRecord<T>(kv: KV, key: string): Promise<T | undefined> {
  const entry = await kv.get(key);
  if (!entry || entry.operation !== "PUT" || entry.length === 0) return undefined;
  return entry.json<T>();
}

/**
 * Writes `record` under `key` only if the key is new. When it exists (a retried request with
 * the same idempotency key), answers the stored record if `sameRequest` holds, else 409.
 */
export async function createRecord<T extends { id: string }>(
  kv: KV,
  key: string,
  record: T,
  sameRequest: (stored: T) => boolean,
): Promise<T> {
  try {
    await kv.create(key, JSON.stringify(record));
    return record;
  } catch (err) {
    if (!(err instanceof JetStreamApiError) || err.code !== JetStreamApiCodes.StreamWrongLastSequence) throw err;
    const stored = await readRecord<T>(kv, key);
    if (stored && sameRequest(stored)) return stored;
    throw IdempotencyKeyReused.make({
      id: record.id,
      message: "this Idempotency-Key was used for a different request",
    });
  }
}

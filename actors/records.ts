// Immutable records: read one, create one exactly once (the server refuses a second write).
import type { RecordStore } from "../platform/index.ts";
import { IdempotencyKeyReused } from "../schemas/index.ts";

/** The stored JSON of `key`, or `undefined` when absent. */
export async function readRecord<T>(store: RecordStore, key: string): Promise<T | undefined> {
  const data = await store.get(key);
  if (!data || data.length === 0) return undefined;
  return JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8")) as T;
}

/**
 * Writes `record` under `key` only if the key is new. When it exists (a retried request with
 * the same idempotency key), answers the stored record if `sameRequest` holds, else 409.
 */
export async function createRecord<T extends { id: string }>(
  store: RecordStore,
  key: string,
  record: T,
  sameRequest: (stored: T) => boolean,
): Promise<T> {
  if ((await store.create(key, JSON.stringify(record))) === "created") return record;
  const stored = await readRecord<T>(store, key);
  if (stored && sameRequest(stored)) return stored;
  throw IdempotencyKeyReused.make({
    id: record.id,
    message: "this Idempotency-Key was used for a different request",
  });
}

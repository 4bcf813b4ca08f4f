// Records: read one, create one exactly once (the server refuses a second write), delete one.
// A stored value that is not its record's shape (written straight to KV by anyone with write
// rights) fails the read that finds it, as a `CorruptRecord` that never carries the value.
import type { TSchema } from "@sinclair/typebox";
import type { RecordStore } from "../platform/index.ts";
import { ajv, IdempotencyKeyReused } from "../schemas/index.ts";

/**
 * A stored record that is not JSON of its record's shape. Answered as a bare 500 and logged
 * once by the adapter; its message says what is wrong, never what the value holds.
 */
export class CorruptRecord extends Error {
  override readonly name = "CorruptRecord";
  constructor(
    readonly bucket: string,
    readonly key: string,
    problem: string,
  ) {
    super(`corrupt record in bucket ${bucket} at key ${key}: ${problem}`);
  }
}

/** What is wrong with a parsed record (naming shapes and fields only), or undefined when nothing is. */
export type RecordCheck = (value: unknown) => string | undefined;

/** What kind of JSON value `value` is, e.g. "an array", "null". */
function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "object" ? "an object" : `a ${typeof value}`;
}

/** Any JSON object: what job records are (their fields are read leniently, by contract). */
export const isObjectRecord: RecordCheck = (value) =>
  kindOf(value) === "an object" ? undefined : `expected an object, found ${kindOf(value)}`;

/** A record of `schema`'s shape; the problem names the failing paths and rules, not the values. */
export function matchesSchema(schema: TSchema): RecordCheck {
  const validate = ajv.compile(schema);
  return (value) => {
    const shape = isObjectRecord(value);
    if (shape || validate(value)) return shape;
    return (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message ?? "is invalid"}`).join("; ");
  };
}

/** The stored JSON of `key`, or `undefined` when absent; throws `CorruptRecord` when it fails `check`. */
export async function readRecord<T>(store: RecordStore, key: string, check: RecordCheck): Promise<T | undefined> {
  const data = await store.get(key);
  if (!data || data.length === 0) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8"));
  } catch {
    // The parser's message quotes the text: leave it out.
    throw new CorruptRecord(store.bucket, key, "not JSON");
  }
  const problem = check(value);
  if (problem !== undefined) throw new CorruptRecord(store.bucket, key, problem);
  return value as T;
}

/**
 * Writes `record` under `key` only if the key is new. When it exists (a retried request with
 * the same idempotency key), answers the stored record if `sameRequest` holds, else 409.
 */
export async function createRecord<T extends { id: string }>(
  store: RecordStore,
  key: string,
  record: T,
  check: RecordCheck,
  sameRequest: (stored: T) => boolean,
): Promise<T> {
  if ((await store.create(key, JSON.stringify(record))) === "created") return record;
  const stored = await readRecord<T>(store, key, check);
  if (stored && sameRequest(stored)) return stored;
  throw IdempotencyKeyReused.make({
    id: record.id,
    message: "this Idempotency-Key was used for a different request",
  });
}

/** Revision-checked writes tried again when another write to the key came between. */
const WRITE_ATTEMPTS = 5;

/**
 * Deletes the record under `key` (whatever it holds, so a corrupt one can go too): true when
 * deleted, false when there was none. The delete names the revision read, so a write that came
 * between is never undone blindly: the key is read again (a bounded number of times).
 */
export async function deleteRecord(store: RecordStore, key: string): Promise<boolean> {
  for (let attempt = 1; ; attempt++) {
    const found = await store.entry(key);
    if (!found) return false;
    if ((await store.delete(key, found.revision)) === "written") return true;
    if (attempt === WRITE_ATTEMPTS)
      throw new Error(`key ${key} of ${store.bucket} kept moving: ${attempt} deletes lost`);
  }
}

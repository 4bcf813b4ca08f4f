// Records: read one, create one exactly once (the server refuses a second write), update or
// delete one by the revision read (the server refuses it when another write came between).
// A stored value that is not its record's shape (written straight to KV by anyone with write
// rights) fails the read that finds it, as a `CorruptRecord` that never carries the value.
import type { TSchema } from "@sinclair/typebox";
import { log, type RecordStore, type WriteOutcome } from "../platform/index.ts";
import { ajv, IdempotencyKeyReused, idKey, ownedKey, ownerPrefix, ServiceUnavailable } from "../schemas/index.ts";

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

/** The key of record `id` among the records of the request's principal (undefined: no such record can exist). */
export const ownKey = (context: { readonly principal: string }, id: string): string | undefined =>
  ownedKey(context.principal, idKey(id));

/** What the keys of the request's principal's records start with (`ownerPrefix`). */
export const ownPrefix = (context: { readonly principal: string }): string => ownerPrefix(context.principal);

/** A record as stored: its value, where it is and at which revision. */
export interface Stored<T> {
  readonly value: T;
  readonly bucket: string;
  readonly key: string;
  readonly revision: number;
  /** The write id its last write was sent with, if any. */
  readonly writtenBy?: string;
  /** Its index entry (an indexed record's place in its list), if any. */
  readonly index?: number;
}

/**
 * The stored JSON of `key` with its revision, or `undefined` when absent; throws `CorruptRecord` when it fails `check`.
 */
export async function readEntry<T>(
  store: RecordStore,
  key: string,
  check: RecordCheck,
): Promise<Stored<T> | undefined> {
  const found = await store.entry(key);
  if (!found || found.value.length === 0) return undefined;
  const data = found.value;
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8"));
  } catch {
    // The parser's message quotes the text: leave it out.
    throw new CorruptRecord(store.bucket, key, "not JSON");
  }
  const problem = check(value);
  if (problem !== undefined) throw new CorruptRecord(store.bucket, key, problem);
  const { revision, writtenBy, index } = found;
  return { value: value as T, bucket: store.bucket, key, revision, writtenBy, index };
}

/** The stored JSON of `key`, or `undefined` when absent; throws `CorruptRecord` when it fails `check`. */
export async function readRecord<T>(store: RecordStore, key: string, check: RecordCheck): Promise<T | undefined> {
  return (await readEntry<T>(store, key, check))?.value;
}

/**
 * Writes `record` under `key` only if the key is new. When it exists (a retried request with
 * the same idempotency key), answers the stored record if `sameRequest` holds, else 409.
 * `create` sends the write (default: the store's create-only write).
 */
export async function createRecord<T extends { id: string }>(
  store: RecordStore,
  key: string,
  record: T,
  check: RecordCheck,
  sameRequest: (stored: T) => boolean,
  create: (key: string, data: string) => Promise<{ readonly revision: number; readonly index?: number } | "exists"> = (
    k,
    data,
  ) => store.create(k, data),
): Promise<Stored<T>> {
  const outcome = await create(key, JSON.stringify(record));
  if (outcome !== "exists")
    return { value: record, bucket: store.bucket, key, revision: outcome.revision, index: outcome.index };
  const stored = await readEntry<T>(store, key, check);
  if (stored && sameRequest(stored.value)) return stored;
  throw IdempotencyKeyReused.make({
    id: record.id,
    message: "this Idempotency-Key was used for a different request",
  });
}

/** Revision-checked writes tried again when another write to the key came between. */
const WRITE_ATTEMPTS = 5;

/**
 * What a write to an existing record requires: `ifMatch`, the revision it must be at (else
 * `mismatch(current)` is thrown); without it, the write applies to whatever revision it reads.
 */
export interface WriteCondition {
  readonly ifMatch?: number;
  readonly mismatch: (current: number) => Error;
  /**
   * The request's id (its Idempotency-Key), sent with the write: a repeat of a request whose
   * write is the record's last one answers that write instead of writing (or refusing) again.
   */
  readonly writeId?: string;
}

/**
 * Replaces the record under `key` by `change(current)`, named by the revision read, so a write
 * that came between is never overwritten: the key is read again (a bounded number of times),
 * unless `ifMatch` named the revision, which then moved (`mismatch`). Undefined when absent.
 */
export async function updateRecord<T>(
  store: RecordStore,
  key: string,
  check: RecordCheck,
  change: (current: T) => T,
  condition: WriteCondition,
): Promise<Stored<T> | undefined> {
  return retryMoved(store, key, async () => {
    const found = await readEntry<T>(store, key, check);
    if (!found) return undefined;
    if (condition.writeId !== undefined && found.writtenBy === condition.writeId) return found;
    requireRevision(condition, found.revision);
    const value = change(found.value);
    // The record keeps naming its index entry.
    const outcome = await store.update(key, JSON.stringify(value), found.revision, condition.writeId, found.index);
    if (outcome === "moved") return outcome;
    return { value, bucket: store.bucket, key, revision: outcome.revision, index: found.index };
  });
}

/**
 * Deletes the record under `key` (whatever it holds, so a corrupt one can go too), named by
 * the revision read, as `updateRecord` writes: the delete's revision, or undefined when absent.
 * `remove` sends the delete (default: the store's revision-checked delete), told the index
 * entry the record named.
 */
export async function deleteRecord(
  store: RecordStore,
  key: string,
  condition: WriteCondition,
  remove: (
    key: string,
    revision: number,
    writeId: string | undefined,
    index: number | undefined,
  ) => Promise<WriteOutcome> = (k, r, w) => store.delete(k, r, w),
): Promise<Stored<null> | undefined> {
  return retryMoved(store, key, async () => {
    const found = await store.lastWrite(key);
    if (!found) return undefined;
    const repeat = condition.writeId !== undefined && found.writtenBy === condition.writeId;
    if (repeat && found.deleted) return { value: null, bucket: store.bucket, key, revision: found.revision };
    if (found.deleted) return undefined;
    requireRevision(condition, found.revision);
    const outcome = await remove(key, found.revision, condition.writeId, found.index);
    return outcome === "moved" ? outcome : { value: null, bucket: store.bucket, key, revision: outcome.revision };
  });
}

function requireRevision(condition: WriteCondition, revision: number): void {
  if (condition.ifMatch !== undefined && condition.ifMatch !== revision) throw condition.mismatch(revision);
}

/** Runs `attempt` again while its write lost to another (`moved`), a bounded number of times. */
async function retryMoved<R>(store: RecordStore, key: string, attempt: () => Promise<R | "moved">): Promise<R> {
  for (let n = 1; ; n++) {
    const outcome = await attempt();
    if (outcome !== "moved") return outcome;
    // The named revision moved between the read and the write: the next read tells which one it is now.
    if (n === WRITE_ATTEMPTS) {
      // Other writers kept winning, or the stream's leader kept refusing the key (one cut off
      // from its peers holds an earlier write of it in flight until it steps down): worth a
      // retry later, as storage trouble is, not a failure of the service.
      log.warn({ bucket: store.bucket, attempts: n }, "a record write was refused every time");
      throw ServiceUnavailable.make(
        {},
        { cause: new Error(`key ${key} of ${store.bucket} kept moving: ${n} writes lost`) },
      );
    }
  }
}

// Lists read a page at a time from a record index (platform/record-index.ts): a page is the
// records of a collection's next index entries, and its cursor the stream sequence of the last
// entry read, tied to the collection it walks (a cursor of another list is a 400).
import { log, type CreateOutcome, type RecordIndex, type WriteOutcome } from "../platform/index.ts";
import { decodeFailure } from "../schemas/index.ts";
import type { Stored } from "./records.ts";

/** A page of a list, and the cursor of the next (absent on the last page). */
export interface RecordPage<T> {
  readonly items: T[];
  readonly cursor?: string;
}

/**
 * How old an entry whose record does not name it must be before a walk removes it: younger, it
 * may be a create between its two writes (or a record being indexed at start).
 */
export const STALE_ENTRY_GRACE_MS = 120_000;

/** The cursor after stream sequence `seq` in the collection `subject`, opaque to callers. */
export const cursorAt = (subject: string, seq: number): string =>
  Buffer.from(`${seq}:${subject}`).toString("base64url");

/**
 * A list's page request from its input: `limit` (default 100) and the sequence it starts after (400 for a cursor not
 * given by it).
 */
export function pageInput(input: { limit?: number | string; cursor?: string }, subject: string) {
  const limit = Number(input.limit ?? 100);
  if (input.cursor === undefined) return { limit, after: 0 };
  const text = Buffer.from(input.cursor, "base64url").toString("utf8");
  const colon = text.indexOf(":");
  const seq = text.slice(0, colon);
  if (
    colon < 0 ||
    !/^[1-9][0-9]{0,15}$/.test(seq) ||
    text.slice(colon + 1) !== subject ||
    cursorAt(subject, Number(seq)) !== input.cursor
  )
    throw decodeFailure(["cursor"], "not a cursor this list answered");
  return { limit, after: Number(seq) };
}

/**
 * The records of the collection `subject` in creation order, a page of `input.limit` entries
 * from its cursor, each read by `read` (in one turn: the reads share a request). An entry whose
 * record is absent or names another entry is left out (the page is then short), and removed
 * once older than `STALE_ENTRY_GRACE_MS`.
 */
export async function listIndexed<T>(
  index: RecordIndex,
  subject: string,
  input: { limit?: number | string; cursor?: string },
  read: (key: string) => Promise<Stored<T> | undefined>,
): Promise<RecordPage<T>> {
  const { limit, after } = pageInput(input, subject);
  const { entries, pending } = await index.page(subject, after, limit);
  const found = await Promise.all(entries.map((entry) => read(entry.key)));
  const items: T[] = [];
  const now = Date.now();
  entries.forEach((entry, i) => {
    const stored = found[i];
    if (stored !== undefined && stored.index === entry.seq) items.push(stored.value);
    else if (now - entry.time > STALE_ENTRY_GRACE_MS) void removeQuietly(index, entry.seq);
  });
  return pending > 0 && entries.length > 0 ? { items, cursor: cursorAt(subject, entries.at(-1)!.seq) } : { items };
}

/** A create's outcome, with the index entry its record names. */
export type IndexedOutcome = { readonly revision: number; readonly index: number } | "exists";

/**
 * Creates the record `key` in the collection `subject`: its entry first, then the record
 * naming it by `write`. When the record is not written ("exists", or a failure) the entry is
 * removed; one left by a crash between the two is stale, and a walk removes it.
 */
export async function createIndexed(
  index: RecordIndex,
  subject: string,
  key: string,
  write: (entry: number) => Promise<CreateOutcome>,
): Promise<IndexedOutcome> {
  const entry = await index.add(subject, key);
  let outcome: CreateOutcome;
  try {
    outcome = await write(entry);
  } catch (err) {
    await removeQuietly(index, entry);
    throw err;
  }
  if (outcome === "exists") {
    await removeQuietly(index, entry);
    return outcome;
  }
  return { revision: outcome.revision, index: entry };
}

/** `remove` of a record, then of its index entry `entry` (a removal that fails leaves it stale). */
export async function deleteIndexed(
  index: RecordIndex,
  entry: number | undefined,
  remove: () => Promise<WriteOutcome>,
): Promise<WriteOutcome> {
  const outcome = await remove();
  // Removed before the delete is answered: a count read after it no longer counts the record.
  if (outcome !== "moved" && entry !== undefined) await removeQuietly(index, entry);
  return outcome;
}

function removeQuietly(index: RecordIndex, entry: number): Promise<void> {
  return index.remove(entry).catch((err: unknown) => {
    log.warn({ bucket: index.bucket, entry, err }, "an index entry was not removed (left stale)");
  });
}

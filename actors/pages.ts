// Lists read a page at a time (platform/record-pages.ts): a page is the records of the next
// creation markers of a collection, and its cursor the stream sequence of the last marker read,
// tied to the collection it walks (a cursor of another list is a 400).
import type { RecordPages } from "../platform/index.ts";
import { decodeFailure } from "../schemas/index.ts";
import type { Stored } from "./records.ts";

/** A page of a list, and the cursor of the next (absent on the last page). */
export interface RecordPage<T> {
  readonly items: T[];
  readonly cursor?: string;
}

/** The cursor after stream sequence `seq` in the collection `prefix`, opaque to callers. */
export const cursorAt = (prefix: string, seq: number): string => Buffer.from(`${seq}:${prefix}`).toString("base64url");

/** A list's page request from its input: `limit` (default 100) and the sequence it starts after (400 for a cursor not given by it). */
export function pageInput(input: { limit?: number | string; cursor?: string }, prefix: string) {
  const limit = Number(input.limit ?? 100);
  if (input.cursor === undefined) return { limit, after: 0 };
  const text = Buffer.from(input.cursor, "base64url").toString("utf8");
  const colon = text.indexOf(":");
  const seq = text.slice(0, colon);
  if (
    colon < 0 ||
    !/^[1-9][0-9]{0,15}$/.test(seq) ||
    text.slice(colon + 1) !== prefix ||
    cursorAt(prefix, Number(seq)) !== input.cursor
  )
    throw decodeFailure(["cursor"], "not a cursor this list answered");
  return { limit, after: Number(seq) };
}

/**
 * The records of the collection `prefix` in creation order, a page of `input.limit` markers
 * from its cursor, each read by `read` (one missing, deleted or not yet written, is left out).
 */
export async function listCreated<T>(
  pages: RecordPages,
  prefix: string,
  input: { limit?: number | string; cursor?: string },
  read: (key: string) => Promise<Stored<T> | undefined>,
): Promise<RecordPage<T>> {
  const { limit, after } = pageInput(input, prefix);
  const { markers, more } = await pages.page(prefix, "c", after, limit);
  const found = await Promise.all(markers.map((m) => read(prefix + m.token)));
  const items = found.flatMap((stored) => (stored ? [stored.value] : []));
  return more ? { items, cursor: cursorAt(prefix, markers.at(-1)!.seq) } : { items };
}

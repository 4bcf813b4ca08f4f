// Walking a list operation's pages over HTTP, as a client would: every page's items, and how
// many pages it took, while something else runs (e.g. creates) after the first page.
import assert from "node:assert/strict";
import { getJson } from "./service.ts";

/** Every page of `url` (which has a query string) at `limit`, while `during` runs after the first. */
export async function allPages<T>(url: string, limit: number, during?: () => Promise<unknown>) {
  const seen: T[] = [];
  let cursor: string | undefined;
  let pages = 0;
  let running: Promise<unknown> | undefined;
  do {
    const res = await getJson(`${url}&limit=${limit}${cursor ? `&cursor=${cursor}` : ""}`);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    const page = res.body as { items: T[]; cursor?: string };
    assert.ok(page.items.length <= limit);
    seen.push(...page.items);
    cursor = page.cursor;
    pages++;
    running ??= during?.();
  } while (cursor);
  await running;
  return { seen, pages };
}

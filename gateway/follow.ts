// Following a read over HTTP (`?follow=1` on an operation with `follow`): the answer is NDJSON,
// one object a line, written as the reads return them; each read after the first starts at the
// last one's cursor and waits for more, until the client closes or a read fails.
import type { ServerResponse } from "node:http";
import type { OperationReply } from "../schemas/index.ts";

type Read = (input: Record<string, unknown>) => Promise<OperationReply>;

/**
 * Returns the loop for `res`: the first read's answer decides the status (an error is answered as
 * JSON, as without `follow`); from then on a failed read ends the stream with an `{"error": …}`
 * line (the declared error body).
 */
export function follow(
  spec: { readonly items: string; readonly waitSeconds: number },
  res: ServerResponse,
  stopping: AbortSignal | undefined,
  read: Read,
) {
  return async (first: Record<string, unknown>): Promise<void> => {
    let closed = false;
    res.once("close", () => (closed = true));
    // The server stops: what was written stands; the read under way is not waited for.
    const stop = () => (res.headersSent ? res.end() : undefined);
    stopping?.addEventListener("abort", stop, { once: true });
    res.once("close", () => stopping?.removeEventListener("abort", stop));
    const { follow: _, ...input } = first;
    let next: Record<string, unknown> = input;
    for (;;) {
      // A read under way when the client leaves is given up (its rejection is that).
      const reply = await read(next).catch((err: unknown) => {
        if (closed) return undefined;
        throw err;
      });
      // Ended meanwhile by its key's revocation (open-streams.ts): nothing more is written.
      if (closed || res.writableEnded || !reply) return;
      if (reply.status !== 200) {
        if (!res.headersSent) {
          res.writeHead(reply.status, { "content-type": "application/json" });
          res.end(reply.data);
        } else {
          res.end(`{"error":${Buffer.from(reply.data).toString()}}\n`);
        }
        return;
      }
      if (!res.headersSent) {
        res.writeHead(200, { "content-type": "application/x-ndjson", "cache-control": "no-store" });
        res.flushHeaders();
      }
      const page = JSON.parse(Buffer.from(reply.data).toString()) as Record<string, unknown>;
      const items = (page[spec.items] as unknown[] | undefined) ?? [];
      const text = items.map((item) => `${JSON.stringify(item)}\n`).join("");
      // A slow reader holds the next read back (bounded memory), a closed one ends the loop.
      if (text && !res.write(text) && !closed) {
        await new Promise((resolve) => {
          res.once("drain", resolve);
          res.once("close", resolve);
        });
      }
      if (closed || stopping?.aborted) {
        if (!res.writableEnded) res.end();
        return;
      }
      next = { ...input, since: page.cursor, waitSeconds: spec.waitSeconds };
    }
  };
}

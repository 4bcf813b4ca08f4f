// One page of a stream's messages under a subject filter, in one request (a batch direct get,
// nats-server 2.11+): what lists and counts of objects cost, whatever the stream holds.
import type { MsgHdrs } from "@nats-io/transport-node";
import { JetStreamRequestError, type Requester } from "../../platform/index.ts";

// Bytes of one page at most (the server ends the batch there): a page of large values.
const PAGE_BYTES = 4 * 1024 * 1024;

/** True for a KV deletion marker (a delete or a purge). */
export const isDeletion = (h: MsgHdrs | undefined): boolean => {
  const op = h?.get("KV-Operation");
  return op === "DEL" || op === "PURGE";
};

/** A page of messages, and how many more match after it. */
export interface Page {
  readonly messages: PageMessage[];
  readonly pending: number;
}

export interface PageMessage {
  readonly seq: number;
  readonly subject: string;
  readonly data: Uint8Array;
  readonly deleted: boolean;
}

/** One batch direct get: the messages of `filter` after sequence `after`, in one request. */
export async function readPage(
  requester: Requester,
  stream: string,
  filter: string,
  after: number,
  limit: number,
  timeout: number,
): Promise<Page> {
  const messages: PageMessage[] = [];
  const end = await requester.requestMany(
    `$JS.API.DIRECT.GET.${stream}`,
    JSON.stringify({ seq: after + 1, next_by_subj: filter, batch: limit, max_bytes: PAGE_BYTES }),
    timeout,
    (msg) => {
      if ((msg.headers?.code ?? 0) !== 0) return true;
      messages.push({
        seq: Number(msg.headers?.get("Nats-Sequence")),
        subject: msg.headers?.get("Nats-Subject") ?? "",
        data: msg.data,
        deleted: isDeletion(msg.headers),
      });
      return false;
    },
  );
  const code = end.headers?.code ?? 0;
  if (code === 404) return { messages, pending: 0 };
  if (code !== 204) throw new JetStreamRequestError(code, 0, end.headers?.description ?? "direct get failed");
  // The end-of-batch status says how many match after the last message sent.
  return { messages, pending: Number(end.headers?.get("Nats-Num-Pending") ?? "0") };
}

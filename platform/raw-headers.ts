// Reading a few headers of a received NATS message without decoding them all: nats.js decodes a
// message's whole header block into a header map on first access (every line split, validated
// and appended), which on the gateway's hot path (every reply and every change notice) cost more
// than the rest of handling the message. This reads one name's first value from the raw block.
import type { Msg } from "@nats-io/transport-node";

/** The headers of a received message, read lazily: `get` answers "" for a name it lacks, like nats.js. */
export interface RawHeaders {
  get(name: string): string;
}

/** What nats.js (3.x `MsgImpl`) keeps of a received message: the header block is `_rdata[0, _msg.hdr)`. */
interface ReceivedMsg {
  readonly _msg?: { readonly hdr?: unknown };
  readonly _rdata?: unknown;
}

/**
 * The headers of `msg`, or undefined when it has none. From the raw block when nats.js keeps one
 * as 3.x does; otherwise (another message class, another version) `msg.headers` as decoded.
 */
export function rawHeaders(msg: Msg): RawHeaders | undefined {
  const received = msg as unknown as ReceivedMsg;
  const length = received._msg?.hdr;
  const data = received._rdata;
  if (typeof length !== "number" || !(data instanceof Uint8Array)) return msg.headers;
  if (length <= 0) return undefined;
  const block = Buffer.from(data.buffer, data.byteOffset, length).toString("utf8");
  return { get: (name) => headerIn(block, name) };
}

/** The first value of `name` (exact case) in a header block (`NATS/1.0…\r\nName: value\r\n…`), or "". */
export function headerIn(block: string, name: string): string {
  const at = block.indexOf(`\r\n${name}:`);
  if (at < 0) return "";
  const start = at + name.length + 3;
  const end = block.indexOf("\r\n", start);
  return block.slice(start, end < 0 ? block.length : end).trim();
}

/** `msg` as the operation reply decoder reads it (`replyOf`), its headers read raw. */
export function leanReply(msg: Msg): { data: Uint8Array; headers?: RawHeaders; json<T>(): T } {
  return { data: msg.data, headers: rawHeaders(msg), json: <T>() => msg.json<T>() };
}

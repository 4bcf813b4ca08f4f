// The object channel: how an object's code inside its instance reaches its storage and alarm,
// which the host holds (instances have no network). The host opens an HTTP Upgrade on the
// runtime's socket, then both sides write NDJSON: the runtime requests, the host answers by id.
// Both halves read their lines through `lineReader` (bounded); nothing here touches NATS.

/** The Upgrade request's path, the protocol token and the header naming the object (URI-encoded). */
export const CHANNEL_PATH = "/__object__/channel";
export const CHANNEL_PROTOCOL = "object-channel";
export const OBJECT_NAME_HEADER = "x-object-name";
/** `POST` here runs the object's alarm handler. */
export const ALARM_PATH = "/__object__/alarm";
/** Longest object name, in characters (the API's bound). */
export const MAX_OBJECT_NAME_CHARS = 256;

/** Longest line the host reads from a runtime: a value is at most 128 KiB as JSON, a key 512 bytes. */
export const MAX_REQUEST_LINE_BYTES = 320 * 1024;
/** Requests of one channel the host serves at once; the runtime waits before sending more. */
export const MAX_IN_FLIGHT = 32;

/** What the object's code asks of the host. */
export type ChannelRequest =
  | { readonly id: number; readonly op: "get"; readonly key: string }
  | { readonly id: number; readonly op: "put"; readonly key: string; readonly value: unknown }
  | { readonly id: number; readonly op: "delete"; readonly key: string }
  | {
      readonly id: number;
      readonly op: "list";
      readonly prefix?: string;
      readonly limit?: number;
      readonly cursor?: string;
    }
  | { readonly id: number; readonly op: "setAlarm"; readonly at: number }
  | { readonly id: number; readonly op: "getAlarm" }
  | { readonly id: number; readonly op: "deleteAlarm" };

export type ChannelOp = ChannelRequest["op"];

/** A failure as the channel carries it: the `_tag`, message and status the object's code sees. */
export interface ChannelError {
  readonly _tag: string;
  readonly message: string;
  readonly status?: number;
}

/** The host's answer to the request `id`. */
export type ChannelAnswer =
  | { readonly id: number; readonly ok: true; readonly value?: unknown }
  | { readonly id: number; readonly ok: false; readonly error: ChannelError };

/** The channel is not open: storage and alarms are reachable only while the host holds the activation. */
export const CHANNEL_CLOSED = "ObjectChannelClosed";

/**
 * Splits a byte stream into lines; a line longer than `maxBytes` (its newline not within them)
 * calls `onOverflow` and stops the reader. Empty lines are skipped.
 */
export function lineReader(
  maxBytes: number,
  onLine: (line: string) => void,
  onOverflow: () => void,
): (chunk: Buffer) => void {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let stopped = false;
  return (chunk) => {
    if (stopped) return;
    let start = 0;
    for (let newline = chunk.indexOf(10); newline !== -1; newline = chunk.indexOf(10, start)) {
      if (pendingBytes + newline - start > maxBytes) return overflow();
      const line =
        pendingBytes === 0
          ? chunk.subarray(start, newline)
          : Buffer.concat([...pending, chunk.subarray(start, newline)]);
      pending = [];
      pendingBytes = 0;
      start = newline + 1;
      const text = line.toString("utf8").trim();
      if (text !== "") onLine(text);
      if (stopped) return;
    }
    const rest = chunk.subarray(start);
    if (pendingBytes + rest.length > maxBytes) return overflow();
    if (rest.length > 0) {
      pending.push(rest);
      pendingBytes += rest.length;
    }
  };
  function overflow() {
    stopped = true;
    pending = [];
    onOverflow();
  }
}

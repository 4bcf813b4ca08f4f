// Client side of a streamed RPC result: NDJSON lines read from a fetch body as an async
// iterable of values; a `~alchemy/rpc/stream-error` line rejects with the remote error.
import { RPC_STREAM_ERROR_TAG, type RpcErrorBody } from "./rpc.ts";
import { MicrovmRpcError } from "./rpc-error.ts";

/** Iterates the values of an NDJSON body once; leaving early cancels the body (and the stream). */
export function ndjsonValues<T>(body: ReadableStream<Uint8Array>, status: number): AsyncIterable<T> {
  let used = false;
  return {
    [Symbol.asyncIterator]() {
      if (used) throw new TypeError("a streamed RPC result can be iterated only once");
      used = true;
      return readValues<T>(body, status);
    },
  };
}

async function* readValues<T>(body: ReadableStream<Uint8Array>, status: number): AsyncGenerator<T> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      buffered += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf("\n")) !== -1) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.trim() !== "") yield decodeLine<T>(line, status);
      }
      if (done) break;
    }
    if (buffered.trim() !== "") yield decodeLine<T>(buffered, status);
    finished = true;
  } finally {
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

function decodeLine<T>(line: string, status: number): T {
  const value = JSON.parse(line) as unknown;
  if (isStreamError(value)) throw new MicrovmRpcError({ source: "stream", status, error: value.error });
  return value as T;
}

function isStreamError(value: unknown): value is { _tag: string; error: RpcErrorBody } {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as { _tag?: unknown })._tag === RPC_STREAM_ERROR_TAG &&
    typeof (value as { error?: unknown }).error === "object"
  );
}

// Writes a method's async-iterable result as NDJSON: one JSON value per line, honouring
// backpressure; a failure after the stream started becomes a last `stream-error` line.
import type { IncomingMessage, ServerResponse } from "node:http";
import { drained } from "../wire/http-util.ts";
import {
  encodeThrown,
  NDJSON_CONTENT_TYPE,
  RPC_STREAM_ERROR_TAG,
  RPC_STREAM_HEADER,
  toJson,
  type RpcStreamErrorLine,
} from "../wire/rpc.ts";

export async function streamNdjson(
  _req: IncomingMessage,
  res: ServerResponse,
  iterable: AsyncIterable<unknown>,
): Promise<void> {
  res.writeHead(200, {
    "content-type": NDJSON_CONTENT_TYPE,
    [RPC_STREAM_HEADER]: "ndjson",
    "cache-control": "no-store",
  });
  res.flushHeaders();
  let iterator: AsyncIterator<unknown>;
  try {
    iterator = iterable[Symbol.asyncIterator]();
  } catch (thrown) {
    res.end(streamErrorLine(thrown));
    return;
  }
  // A caller that goes away stops the producer (an async generator runs its `finally`).
  let gone = false;
  const onClose = () => {
    if (res.writableFinished) return;
    gone = true;
    iterator.return?.().catch(() => undefined);
  };
  res.once("close", onClose);
  try {
    while (!gone) {
      const step = await iterator.next();
      if (step.done || gone) break;
      if (!res.write(`${toJson(step.value)}\n`)) await drained(res);
    }
    if (!gone) res.end();
  } catch (thrown) {
    if (!gone) res.end(streamErrorLine(thrown));
  } finally {
    res.off("close", onClose);
  }
}

function streamErrorLine(thrown: unknown): string {
  const line: RpcStreamErrorLine = { _tag: RPC_STREAM_ERROR_TAG, error: encodeThrown(thrown) };
  return `${JSON.stringify(line)}\n`;
}

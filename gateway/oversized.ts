// Answering a request whose body is over the limit while the client may still be sending it,
// the way nginx (lingering close) and Fastify do: the 413 goes out at once, then the rest of
// the body is read and discarded, up to a bound in bytes and in time, and only then is the
// connection closed. Closing at once with unread bytes makes the kernel reset the
// connection, and a client still writing gets EPIPE or ECONNRESET instead of the answer.
import type { ServerResponse } from "node:http";

export interface DrainBounds {
  /** Bytes read and discarded after the answer before the connection is closed anyway. */
  readonly maxBytes: number;
  /** Time after the answer before the connection is closed anyway. */
  readonly maxMs: number;
}

export const DRAIN_BOUNDS: DrainBounds = { maxBytes: 8 * 1024 * 1024, maxMs: 5_000 };

/** Sends `body` with `connection: close`, drains the request (bounded), then ends the response. */
export function answerThenDrain(res: ServerResponse, status: number, body: string, bounds = DRAIN_BOUNDS): void {
  const req = res.req;
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    connection: "close",
  });
  if (req.complete || req.destroyed) return void res.end(body);
  res.write(body); // the whole answer (content-length): the client can read it now
  let discarded = 0;
  const done = () => {
    clearTimeout(timer);
    req.off("data", onData).off("end", done).off("error", done).off("close", done);
    res.end(); // the server closes the connection once this has been written
  };
  const onData = (chunk: Buffer) => {
    discarded += chunk.length;
    if (discarded > bounds.maxBytes) done();
  };
  const timer = setTimeout(done, bounds.maxMs);
  timer.unref();
  req.on("data", onData).once("end", done).once("error", done).once("close", done);
  req.resume();
}

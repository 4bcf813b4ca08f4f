// Small node:http helpers shared by the runtime and the proxy: bounded body reading,
// JSON answers, and waiting for a writable to drain without hanging on a closed socket.
import type { IncomingMessage, ServerResponse } from "node:http";

/** The body exceeded its limit. */
export class BodyTooLargeError extends Error {
  constructor(readonly limitBytes: number) {
    super(`request body exceeds ${limitBytes} bytes`);
    this.name = "BodyTooLargeError";
  }
}

/** Reads a whole request body, rejecting with BodyTooLargeError past `limitBytes`. */
export function readBody(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"]);
  if (Number.isFinite(declared) && declared > limitBytes) return Promise.reject(new BodyTooLargeError(limitBytes));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limitBytes) {
        cleanup();
        reject(new BodyTooLargeError(limitBytes));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, size));
    };
    const onError = (error: Error) => {
      cleanup();
      reject(error);
    };
    const onClose = () => {
      if (!req.complete) onError(new Error("request closed before its body ended"));
    };
    const cleanup = () => {
      req.off("data", onData).off("end", onEnd).off("error", onError).off("close", onClose);
    };
    req.on("data", onData).on("end", onEnd).on("error", onError).on("close", onClose);
  });
}

/** Answers with a JSON body unless the response already started or the socket is gone. */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | number> = {},
): void {
  if (res.headersSent || res.destroyed) {
    if (!res.writableEnded) res.destroy();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** Resolves when `res` drains or closes (so a vanished client never hangs a writer). */
export function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done).off("close", done);
      resolve();
    };
    res.on("drain", done).on("close", done);
  });
}

/** The raw path of a request target (origin-form or absolute-form), or undefined if unusable. */
export function rawPath(target: string | undefined): string | undefined {
  if (!target) return undefined;
  if (target.startsWith("/")) {
    const query = target.indexOf("?");
    return query === -1 ? target : target.slice(0, query);
  }
  try {
    return new URL(target).pathname;
  } catch {
    return undefined;
  }
}

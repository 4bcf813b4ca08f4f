// Reading a JSON request body: content type check, a byte limit, and parsing.
import type { IncomingMessage } from "node:http";
import { decodeFailure, PayloadTooLarge, UnsupportedMediaType, type ApiError } from "../schemas/index.ts";

/** True for a missing content type (read as JSON), `application/json` and `+json` types. */
export function isJsonContentType(header: string | undefined): boolean {
  if (!header) return true;
  const type = header.split(";", 1)[0]!.trim().toLowerCase();
  return type === "application/json" || /^application\/[\w.+-]+\+json$/.test(type);
}

/**
 * Reads and parses the body; throws 415, 413 or 400 as `ApiError`s. An empty body is a 400,
 * or `undefined` when `optional`.
 */
export async function readJsonBody(req: IncomingMessage, limit: number, optional = false): Promise<unknown> {
  if (!isJsonContentType(req.headers["content-type"])) {
    throw UnsupportedMediaType.make({});
  }
  const declared = Number(req.headers["content-length"]);
  if (declared > limit) throw tooLarge(limit);
  const text = await readText(req, limit);
  if (text.trim() === "") {
    if (optional) return undefined;
    throw decodeFailure([], "a JSON body is required");
  }
  try {
    return JSON.parse(text);
  } catch {
    throw decodeFailure([], "the body is not valid JSON");
  }
}

/** The body as text, read with plain stream events (an async iterator costs more per chunk). */
function readText(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        req.pause();
        reject(tooLarge(limit));
      } else chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks, size).toString("utf8"));
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    function cleanup() {
      req.off("data", onData).off("end", onEnd).off("error", onError);
    }
    req.on("data", onData).on("end", onEnd).on("error", onError);
  });
}

function tooLarge(limit: number): ApiError {
  return PayloadTooLarge.make({ limit, message: `request body exceeds ${limit} bytes` });
}

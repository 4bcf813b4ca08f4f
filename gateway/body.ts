// Reading a JSON request body: content type check, a byte limit, and parsing.
import type { IncomingMessage } from "node:http";
import { HttpApiDecodeError, PayloadTooLarge, UnsupportedMediaType, type ApiError } from "../schemas/index.ts";

/** True for a missing content type (read as JSON), `application/json` and `+json` types. */
export function isJsonContentType(header: string | undefined): boolean {
  if (!header) return true;
  const type = header.split(";", 1)[0]!.trim().toLowerCase();
  return type === "application/json" || /^application\/[\w.+-]+\+json$/.test(type);
}

/** Reads and parses the body; throws 415, 413 or 400 as `ApiError`s. */
export async function readJsonBody(req: IncomingMessage, limit: number): Promise<unknown> {
  if (!isJsonContentType(req.headers["content-type"])) {
    throw UnsupportedMediaType.make({ message: "request body must be application/json" });
  }
  const declared = Number(req.headers["content-length"]);
  if (declared > limit) throw tooLarge(limit);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw tooLarge(limit);
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks, size).toString("utf8");
  if (text.trim() === "") throw invalidBody("a JSON body is required");
  try {
    return JSON.parse(text);
  } catch {
    throw invalidBody("the body is not valid JSON");
  }
}

function tooLarge(limit: number): ApiError {
  return PayloadTooLarge.make({ limit, message: `request body exceeds ${limit} bytes` });
}

function invalidBody(message: string): ApiError {
  return HttpApiDecodeError.make({ issues: [{ _tag: "Type", path: [], message }], message });
}

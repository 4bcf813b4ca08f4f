// Converts between node:http and WHATWG fetch: an IncomingMessage becomes a Request (body
// streamed, aborted when the caller leaves) and a Response is written back, streamed.
import type { IncomingMessage, ServerResponse } from "node:http";
import { Readable } from "node:stream";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import { drained } from "../wire/http-util.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";

/** Builds the Request the image's fetch sees; throws on a target that is not a URL. */
export function toWebRequest(req: IncomingMessage, signal: AbortSignal): Request {
  const url = requestUrl(req);
  const headers = new Headers();
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i] as string;
    if (name.startsWith(":") || name.toLowerCase() === INSTANCE_SECRET_HEADER) continue;
    try {
      headers.append(name, raw[i + 1] as string);
    } catch {
      // A header fetch cannot represent (node accepts more than WHATWG does): drop it.
    }
  }
  const method = req.method ?? "GET";
  const hasBody = method !== "GET" && method !== "HEAD";
  return new Request(url, {
    method,
    headers,
    signal,
    ...(hasBody ? { body: Readable.toWeb(req) as ReadableStream<Uint8Array>, duplex: "half" as const } : {}),
  });
}

/** Writes a fetch Response to a node response, streaming its body. */
export async function sendWebResponse(req: IncomingMessage, res: ServerResponse, response: Response): Promise<void> {
  res.statusCode = response.status;
  if (response.statusText) res.statusMessage = response.statusText;
  response.headers.forEach((value, name) => {
    if (name !== "set-cookie") res.setHeader(name, value);
  });
  const cookies = response.headers.getSetCookie();
  if (cookies.length > 0) res.setHeader("set-cookie", cookies);
  if (!response.body || req.method === "HEAD") {
    await response.body?.cancel().catch(() => undefined);
    res.end();
    return;
  }
  const body = Readable.fromWeb(response.body as NodeReadableStream<Uint8Array>);
  try {
    for await (const chunk of body) {
      if (res.destroyed) break;
      if (!res.write(chunk)) await drained(res);
    }
    res.end();
  } catch {
    res.destroy();
  } finally {
    body.destroy();
  }
}

function requestUrl(req: IncomingMessage): URL {
  const target = req.url ?? "/";
  if (!target.startsWith("/")) return new URL(target);
  try {
    return new URL(`http://${req.headers.host ?? "127.0.0.1"}${target}`);
  } catch {
    return new URL(`http://127.0.0.1${target}`);
  }
}

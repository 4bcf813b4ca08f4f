// How the stub sends an RPC call: a POST with a JSON body answered by a status, a stream
// flag and a body. The default rides a shared `node:http` keep-alive Agent (a few hundred µs
// cheaper per call than undici's fetch); a `fetch` transport serves tests and other runtimes.
import { Agent, request } from "node:http";
import { Readable } from "node:stream";
import { RPC_STREAM_HEADER } from "../wire/rpc.ts";

/** One RPC answer: `stream` is set (and `text` empty) for an ok NDJSON stream. */
export interface RpcAnswer {
  readonly status: number;
  readonly ok: boolean;
  readonly text: string;
  readonly stream?: ReadableStream<Uint8Array>;
}

/** Posts `body` to `url` with `headers`; rejects only when no answer arrives. */
export type RpcTransport = (url: string, headers: Record<string, string>, body: string) => Promise<RpcAnswer>;

/** Shared by every stub without its own transport; idle sockets do not keep a process alive. */
const sharedAgent = new Agent({ keepAlive: true, maxSockets: 256 });

/** The default transport (plain http endpoints only). */
export function httpTransport(agent: Agent = sharedAgent): RpcTransport {
  return (url, headers, body) =>
    new Promise((resolve, reject) => {
      const outgoing = request(url, {
        method: "POST",
        agent,
        headers: { ...headers, "content-length": Buffer.byteLength(body) },
      });
      outgoing.on("error", reject);
      outgoing.on("response", (answer) => {
        const status = answer.statusCode ?? 0;
        const ok = status >= 200 && status < 300;
        if (ok && answer.headers[RPC_STREAM_HEADER.toLowerCase()] === "ndjson") {
          resolve({ status, ok, text: "", stream: Readable.toWeb(answer) as ReadableStream<Uint8Array> });
          return;
        }
        const chunks: Buffer[] = [];
        answer.on("data", (chunk: Buffer) => chunks.push(chunk));
        answer.on("end", () => resolve({ status, ok, text: Buffer.concat(chunks).toString("utf8") }));
        answer.on("error", reject);
        answer.on("close", () => {
          if (!answer.complete) reject(new Error(`connection to ${url} closed before the answer ended`));
        });
      });
      outgoing.end(body);
    });
}

/** A transport over a fetch implementation. */
export function fetchTransport(fetchImpl: typeof globalThis.fetch): RpcTransport {
  return async (url, headers, body) => {
    const response = await fetchImpl(url, { method: "POST", headers, body });
    if (response.ok && response.headers.get(RPC_STREAM_HEADER) === "ndjson" && response.body) {
      return { status: response.status, ok: true, text: "", stream: response.body };
    }
    return { status: response.status, ok: response.ok, text: await response.text() };
  };
}

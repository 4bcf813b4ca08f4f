// Example image: typed RPC methods (plain, schema-checked, streamed, failing) and a fetch
// handler answering `GET /echo?message=…`, `/headers` (what it received) and plain text elsewhere.
import { Type } from "@sinclair/typebox";
import { defineImage, method } from "../image.ts";

/** A tagged error that declares its HTTP status; its fields travel to the caller. */
export class Unlucky extends Error {
  readonly _tag = "Unlucky";
  readonly status = 418;
  constructor(readonly number: number) {
    super(`${number} is an unlucky number`);
    this.name = "Unlucky";
  }
}

/** Thrown part-way through a stream. */
export class CountInterrupted extends Error {
  readonly _tag = "CountInterrupted";
  constructor(readonly at: number) {
    super(`count interrupted after ${at}`);
  }
}

async function* countTo(n: number, failAfter?: number): AsyncGenerator<number> {
  for (let i = 1; i <= n; i++) {
    if (failAfter !== undefined && i > failAfter) throw new CountInterrupted(failAfter);
    yield i;
  }
}

export default defineImage({
  methods: {
    hello: method({
      args: Type.Tuple([Type.String()]),
      result: Type.String(),
      handler: (message) => `hello, ${message}!`,
    }),
    add: method({
      args: Type.Tuple([Type.Number(), Type.Number()]),
      handler: (a, b) => a + b,
    }),
    /** Streams 1..n as NDJSON. */
    count: method({
      args: Type.Tuple([Type.Integer({ minimum: 0, maximum: 100_000 })]),
      handler: (n) => countTo(n),
    }),
    /** Streams 1..n but fails after `failAfter` values. */
    countThenFail: method({
      args: Type.Tuple([Type.Integer({ minimum: 0 }), Type.Integer({ minimum: 0 })]),
      handler: (n, failAfter) => countTo(n, failAfter),
    }),
    /** Throws the tagged `Unlucky` error (status 418) for 13, else echoes the number. */
    lucky: {
      handler: (n: number) => {
        if (n === 13) throw new Unlucky(n);
        return n;
      },
    },
    /** Throws an untagged error: 500 with its message, never its stack. */
    crash: {
      handler: (): never => {
        throw new Error("boom");
      },
    },
    /** Returns nothing: `null` on the wire. */
    nothing: { handler: (): void => undefined },
    /** Resolves after `ms` milliseconds (for in-flight and suspend tests). */
    sleep: method({
      args: Type.Tuple([Type.Integer({ minimum: 0, maximum: 60_000 })]),
      handler: (ms) => new Promise<number>((resolve) => setTimeout(() => resolve(ms), ms)),
    }),
  },
  fetch(request) {
    const url = new URL(request.url);
    if (request.method === "GET" && url.pathname === "/echo") {
      return new Response(url.searchParams.get("message") ?? "", {
        headers: { "content-type": "text/plain; charset=utf-8" },
      });
    }
    if (url.pathname === "/headers") {
      return Response.json(Object.fromEntries(request.headers));
    }
    if (request.method === "POST" && url.pathname === "/echo") {
      return new Response(request.body, {
        headers: { "content-type": request.headers.get("content-type") ?? "application/octet-stream" },
      });
    }
    return new Response(`sandbox: ${request.method} ${url.pathname}\n`, {
      headers: { "content-type": "text/plain; charset=utf-8" },
    });
  },
});

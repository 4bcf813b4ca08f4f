// The typed stub of an object: `object<Shape>(image, name, options)` returns an object whose
// every property is a method of the object (`await counter.inc(1)` → POST
// /2025-09-09/objects/counter/<name>/rpc/inc on the microVM API, with the caller's API key).
import { httpTransport, fetchTransport, type RpcTransport } from "./transport.ts";
import { decodeFailure, withoutTrailingUndefined, type AnyShape } from "./stub.ts";

/** Where the microVM API is when neither `url` nor `MICROVM_API_URL` says. */
export const DEFAULT_MICROVM_API_URL = "http://127.0.0.1:8789";

export interface ObjectOptions {
  /** The microVM API (default: env `MICROVM_API_URL`, else http://127.0.0.1:8789). */
  readonly url?: string;
  /** An API key, sent as `Authorization: Bearer <key>` (default: env `TASKCTL_API_KEY`, if set). */
  readonly apiKey?: string;
  /** Sends the calls (tests, runtimes without `node:http`); default a shared keep-alive agent. */
  readonly fetch?: typeof globalThis.fetch;
}

/** A lower-level handle of an object: call any method by name (e.g. one named `then`). */
export interface ObjectConnection {
  call(method: string, args: readonly unknown[]): Promise<unknown>;
}

/**
 * The object `name` of `image` (yours: the API key says whose); `S` is its client shape. A
 * call rejects with a `MicrovmRpcError`: source `rpc` for what the method threw, `api` for a
 * refusal of the API (`ImageNotFound`, `NotAnObject`, `ObjectBusy` or `ObjectLimitExceeded` with its
 * `retryAfterSeconds`).
 */
export function object<S extends object = AnyShape>(image: string, name: string, options: ObjectOptions = {}): S {
  const connection = objectConnection(image, name, options);
  return new Proxy(Object.create(null) as S, {
    get(_target, property) {
      // Not thenable, so `await object(...)` and promise resolution leave it alone.
      if (typeof property !== "string" || property === "then") return undefined;
      return (...args: unknown[]) => connection.call(property, args);
    },
  });
}

export function objectConnection(image: string, name: string, options: ObjectOptions = {}): ObjectConnection {
  if (name === "") throw new TypeError("an object's name has 1 to 256 characters");
  const env = typeof process === "undefined" ? {} : process.env;
  const base = (options.url ?? (env.MICROVM_API_URL || DEFAULT_MICROVM_API_URL)).replace(/\/+$/, "");
  const apiKey = options.apiKey ?? (env.TASKCTL_API_KEY || undefined);
  const transport: RpcTransport =
    options.fetch === undefined && base.startsWith("http://")
      ? httpTransport()
      : fetchTransport(options.fetch ?? globalThis.fetch);
  const headers: Record<string, string> = {
    "content-type": "application/json",
    ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
  };
  const prefix = `${base}/2025-09-09/objects/${encodeURIComponent(image)}/${encodeURIComponent(name)}/rpc/`;
  return {
    async call(method, args) {
      const answer = await transport(
        prefix + encodeURIComponent(method),
        headers,
        JSON.stringify(withoutTrailingUndefined(args)),
      );
      if (!answer.ok) throw decodeFailure(answer.status, answer.text, "api");
      return answer.text === "" ? null : (JSON.parse(answer.text) as unknown);
    },
  };
}

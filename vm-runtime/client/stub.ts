// The client stub: `connectMicrovm<Shape>(...)` returns an object whose every property is a
// remote method (`await stub.hello("world")` → POST /__rpc__/hello through the proxy), plus
// `stub.fetch(path, init)` for the image's fetch handler.
import type { Image, ImageShape } from "../image.ts";
import { fetchTransport, httpTransport, type RpcTransport } from "./transport.ts";
import { ndjsonValues } from "../wire/ndjson.ts";
import { MicrovmRpcError, type RpcFailureSource } from "../wire/rpc-error.ts";
import { RPC_ERROR_TAG, rpcPath, type RpcErrorBody } from "../wire/rpc.ts";
import { PROXY_AUTH_HEADER, PROXY_PORT_HEADER } from "../wire/proxy-headers.ts";

export interface ConnectOptions {
  /** The instance endpoint `host:port` (or a full `http://` URL). */
  readonly endpoint: string;
  /** A token, or CreateAuthToken's `authToken` object `{ "X-aws-proxy-auth": token }`. */
  readonly authToken: string | { readonly [PROXY_AUTH_HEADER]: string };
  /** Instance port to reach (X-aws-proxy-port); the proxy's default (8080) when absent. */
  readonly port?: number;
  /**
   * Used for `stub.fetch`, and for RPC calls too when given (tests, runtimes without
   * `node:http`). Without it, calls ride a shared `node:http` keep-alive agent.
   */
  readonly fetch?: typeof globalThis.fetch;
}

/** Any image shape: methods taking JSON arguments and resolving to JSON (or a stream). */
export type AnyShape = Record<string, (...args: any[]) => Promise<unknown>>;

/** The stub: the image's methods plus `fetch`. */
export type MicrovmStub<S> = S & {
  /** Sends a request to the image's fetch handler through the proxy; `path` starts with "/". */
  fetch(path: string, init?: RequestInit): Promise<Response>;
};

/** A lower-level connection: call any method by name (e.g. one named `then` or `fetch`). */
export interface MicrovmConnection {
  call(method: string, args: readonly unknown[]): Promise<unknown>;
  fetch(path: string, init?: RequestInit): Promise<Response>;
}

/** Connects to an instance; `S` is `ImageShape<typeof image>` or any method map. */
export function connectMicrovm<S extends object = AnyShape>(options: ConnectOptions): MicrovmStub<S> {
  const connection = microvmConnection(options);
  return new Proxy(Object.create(null) as MicrovmStub<S>, {
    get(_target, property) {
      if (property === "fetch") return connection.fetch;
      // Not thenable, so `await connectMicrovm(...)` and promise resolution leave it alone.
      if (typeof property !== "string" || property === "then") return undefined;
      return (...args: unknown[]) => connection.call(property, args);
    },
  });
}

/** Same as connectMicrovm, typed from the image module itself. */
export function connectImage<I extends Image>(
  _image: I | undefined,
  options: ConnectOptions,
): MicrovmStub<ImageShape<I>> {
  return connectMicrovm<ImageShape<I>>(options);
}

export function microvmConnection(options: ConnectOptions): MicrovmConnection {
  const base = baseUrl(options.endpoint);
  const fetchImpl = options.fetch ?? globalThis.fetch;
  const transport: RpcTransport =
    options.fetch === undefined && base.startsWith("http://") ? httpTransport() : fetchTransport(fetchImpl);
  const token = typeof options.authToken === "string" ? options.authToken : options.authToken[PROXY_AUTH_HEADER];
  const withProxyHeaders = (init?: ConstructorParameters<typeof Headers>[0]) => {
    const headers = new Headers(init);
    headers.set(PROXY_AUTH_HEADER, token);
    if (options.port !== undefined) headers.set(PROXY_PORT_HEADER, String(options.port));
    return headers;
  };
  const rpcHeaders: Record<string, string> = {
    "content-type": "application/json",
    [PROXY_AUTH_HEADER]: token,
    ...(options.port === undefined ? {} : { [PROXY_PORT_HEADER]: String(options.port) }),
  };
  return {
    async call(method, args) {
      const answer = await transport(
        base + rpcPath(method),
        rpcHeaders,
        JSON.stringify(withoutTrailingUndefined(args)),
      );
      if (answer.stream) return ndjsonValues(answer.stream, answer.status);
      if (!answer.ok) throw decodeFailure(answer.status, answer.text);
      return answer.text === "" ? null : (JSON.parse(answer.text) as unknown);
    },
    fetch(path, init) {
      return fetchImpl(base + (path.startsWith("/") ? path : `/${path}`), {
        ...init,
        headers: withProxyHeaders(init?.headers),
      });
    },
  };
}

/**
 * What a call that was not a success rejects with: the method's error (`rpc`), a refusal of what
 * stands before it (`refusedBy`: the instance proxy, or the microVM API for objects), or the text.
 */
export function decodeFailure(
  status: number,
  text: string,
  refusedBy: Extract<RpcFailureSource, "proxy" | "api"> = "proxy",
): MicrovmRpcError {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return new MicrovmRpcError({ source: "http", status, error: { message: text || `HTTP ${status}` } });
  }
  if (isObject(body) && body._tag === RPC_ERROR_TAG && isObject(body.error)) {
    return new MicrovmRpcError({ source: "rpc", status, error: withMessage(body.error) });
  }
  if (isObject(body) && typeof body._tag === "string") {
    return new MicrovmRpcError({ source: refusedBy, status, error: withMessage(body) });
  }
  return new MicrovmRpcError({ source: "http", status, error: { message: text } });
}

function withMessage(error: Record<string, unknown>): RpcErrorBody {
  return { ...error, message: typeof error.message === "string" ? error.message : "" } as RpcErrorBody;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `f(a, undefined)` is `f(a)`: JSON would turn a trailing `undefined` into `null`. */
export function withoutTrailingUndefined(args: readonly unknown[]): unknown[] {
  let end = args.length;
  while (end > 0 && args[end - 1] === undefined) end -= 1;
  return args.slice(0, end);
}

function baseUrl(endpoint: string): string {
  const url = /^https?:\/\//.test(endpoint) ? endpoint : `http://${endpoint}`;
  return url.replace(/\/+$/, "");
}

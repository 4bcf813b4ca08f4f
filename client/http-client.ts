// The typed client over HTTP: routes, query strings and bodies derived from the operations.
import type { Operation } from "../schemas/index.ts";
import { ClientError } from "./client-error.ts";
import { makeClient, type Client, type ClientOptions } from "./typed-client.ts";

/** What the client needs of `fetch` (which fits it): send one request, read status and text. */
export type HttpSend = (
  url: URL,
  init: { method: string; headers: Record<string, string>; body?: string; signal?: AbortSignal },
) => Promise<{
  readonly status: number;
  readonly ok: boolean;
  readonly headers?: { get(name: string): string | null };
  text(): Promise<string>;
}>;

export interface HttpClientOptions extends ClientOptions {
  /** How requests are sent; default the global `fetch`. */
  fetch?: HttpSend;
  /** Sent as `Authorization: Bearer <key>`. */
  apiKey?: string;
  /**
   * Abort a call that has no answer after this long (ms), plus the time the operation was asked
   * to wait (RunMicrovm's `waitSeconds`), so a timeout never cuts a wait short. Default: none.
   */
  timeoutMs?: number;
}

/** A client for one HTTP API (e.g. `taskApi` at `http://127.0.0.1:8787`). */
export function httpClient<Api extends Record<string, Operation>>(
  api: Api,
  baseUrl: string,
  { fetch: fetchImpl = fetch, apiKey, timeoutMs, ...options }: HttpClientOptions = {},
): Client<Api> {
  return makeClient(
    api,
    async (op, input, callOptions) => {
      const url = new URL(httpPath(op, input), baseUrl);
      for (const key of Object.keys(op.query?.properties ?? {})) {
        if (input[key] !== undefined) url.searchParams.set(key, String(input[key]));
      }
      const headers: Record<string, string> = {};
      if (callOptions?.idempotencyKey) headers["idempotency-key"] = callOptions.idempotencyKey;
      if (callOptions?.ifMatch !== undefined) headers["if-match"] = `"${callOptions.ifMatch}"`;
      if (apiKey) headers.authorization = `Bearer ${apiKey}`;
      let body: string | undefined;
      if (op.body !== undefined) {
        // The body is one field's value (an object call's arguments); none: the field's default.
        if (input[op.body] !== undefined) body = JSON.stringify(input[op.body]);
      } else if (op.payload) body = JSON.stringify(pick(input, Object.keys(op.payload.properties)));
      // Every POST says JSON, with a body or not (the microVM API refuses any other: 415), and so does any body.
      if (op.http.method === "POST" || body !== undefined) headers["content-type"] = "application/json";
      const signal = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs + (op.waitMsOf?.(input) ?? 0));
      let res: Awaited<ReturnType<HttpSend>>;
      try {
        res = await fetchImpl(url, { method: op.http.method, headers, body, signal });
      } catch (cause) {
        throw new ClientError(503, { _tag: "ServiceUnavailable", message: `cannot reach ${url}` }, { cause });
      }
      const text = await res.text();
      const value = text ? JSON.parse(text) : undefined;
      if (!res.ok)
        throw new ClientError(
          res.status,
          value ?? { _tag: "InternalServerError", message: `${res.status} with no body` },
        );
      const etag = res.headers?.get("etag")?.replace(/"/g, "");
      if (etag) callOptions?.onRevision?.(Number(etag));
      // A success with no body (HTTP 204) is `null`, as over NATS.
      return value ?? null;
    },
    options,
  );
}

function httpPath(op: Operation, input: Record<string, unknown>): string {
  return op.http.path.replace(/:(\w+)/g, (_, key: string) => encodeURIComponent(String(input[key])));
}

function pick(input: Record<string, unknown>, keys: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of keys) if (input[key] !== undefined) out[key] = input[key];
  return out;
}

// Typed clients derived from the contracts, over HTTP or straight over NATS. A method
// resolves to the success value or rejects with a `ClientError` whose `error._tag` says why.
import type { NatsConnection } from "@nats-io/transport-node";
import { headers as natsHeaders, TimeoutError } from "@nats-io/transport-node";
import { ClientError } from "./client-error.ts";
import {
  ApiError,
  compileDecoder,
  IDEMPOTENCY_KEY_HEADER,
  inputSchema,
  requestSubject,
  requestBody,
  replyValue,
  type InputOf,
  type Operation,
  type SuccessOf,
} from "../schemas/index.ts";

export { watchJobs, type JobCreated } from "./watch.ts";
export { connectToService, serviceNats, type ServiceConnectOptions } from "./connect.ts";
export {
  launchMicrovm,
  MicrovmLaunchError,
  type LaunchOptions,
  type LaunchWork,
  type LaunchedMicrovm,
  type MicrovmApiClient,
} from "./launch.ts";

export { ClientError, type ClientErrorBody, type TransportErrorTag } from "./client-error.ts";

/** A declared error (a decode failure here, an error reply) as the `ClientError` a call rejects with. */
function asClientError(err: unknown): unknown {
  return err instanceof ApiError ? new ClientError(err.status, err.body as never) : err;
}

export interface CallOptions {
  /** Fixes the id of a created record, so retrying the same call never creates two. */
  idempotencyKey?: string;
}

export type Client<Api extends Record<string, Operation>> = {
  [K in keyof Api]: (input: InputOf<Api[K]>, options?: CallOptions) => Promise<SuccessOf<Api[K]>>;
};

type Call = (op: Operation, input: Record<string, unknown>, options?: CallOptions) => Promise<unknown>;

function makeClient<Api extends Record<string, Operation>>(api: Api, call: Call): Client<Api> {
  const client: Record<string, unknown> = {};
  for (const [key, op] of Object.entries(api)) {
    const decode = compileDecoder(inputSchema(op));
    client[key] = async (input: Record<string, unknown>, options?: CallOptions) => {
      let decoded: Record<string, unknown>;
      try {
        decoded = decode({ ...input });
      } catch (err) {
        throw asClientError(err);
      }
      return call(op, decoded, options);
    };
  }
  return client as Client<Api>;
}

/** A client for one HTTP API (e.g. `taskApi` at `http://127.0.0.1:8787`). */
export function httpClient<Api extends Record<string, Operation>>(
  api: Api,
  baseUrl: string,
  { fetch: fetchImpl = fetch, apiKey }: { fetch?: typeof fetch; apiKey?: string } = {},
): Client<Api> {
  return makeClient(api, async (op, input, options) => {
    const url = new URL(httpPath(op, input), baseUrl);
    for (const key of Object.keys(op.query?.properties ?? {})) {
      if (input[key] !== undefined) url.searchParams.set(key, String(input[key]));
    }
    const headers: Record<string, string> = {};
    if (options?.idempotencyKey) headers["idempotency-key"] = options.idempotencyKey;
    if (apiKey) headers.authorization = `Bearer ${apiKey}`;
    // Every POST says JSON, with a body or not: the microVM API refuses any other (415).
    if (op.http.method === "POST") headers["content-type"] = "application/json";
    let body: string | undefined;
    if (op.payload) body = JSON.stringify(pick(input, Object.keys(op.payload.properties)));
    let res: Response;
    try {
      res = await fetchImpl(url, { method: op.http.method, headers, body });
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
    return value;
  });
}

/** A client that calls the actors straight over NATS (no HTTP hop). */
export function natsClient<Api extends Record<string, Operation>>(
  api: Api,
  nc: NatsConnection,
  { prefix = "", timeoutMs = 5_000 }: { prefix?: string; timeoutMs?: number } = {},
): Client<Api> {
  return makeClient(api, async (op, input, options) => {
    const h = natsHeaders();
    if (options?.idempotencyKey) h.set(IDEMPOTENCY_KEY_HEADER, options.idempotencyKey);
    let reply;
    try {
      reply = await nc.request(requestSubject(op, input, prefix), requestBody(op, input), {
        timeout: Math.max(timeoutMs, op.timeoutMs ?? 0) + (op.waitMsOf?.(input as Record<string, unknown>) ?? 0),
        headers: h,
      });
    } catch (cause) {
      const timeout = cause instanceof TimeoutError;
      throw new ClientError(
        timeout ? 504 : 503,
        timeout
          ? { _tag: "GatewayTimeout", message: "no answer over NATS in time: the outcome is unknown" }
          : { _tag: "ServiceUnavailable", message: `NATS request failed: ${(cause as Error).message}` },
        { cause },
      );
    }
    try {
      return replyValue(reply);
    } catch (err) {
      throw asClientError(err);
    }
  });
}

function httpPath(op: Operation, input: Record<string, unknown>): string {
  return op.http.path.replace(/:(\w+)/g, (_, key: string) => encodeURIComponent(String(input[key])));
}

function pick(input: Record<string, unknown>, keys: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of keys) if (input[key] !== undefined) out[key] = input[key];
  return out;
}

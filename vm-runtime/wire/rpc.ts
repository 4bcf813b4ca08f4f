// The RPC wire contract shared by the runtime and the client: paths, envelope tags, headers,
// and how a thrown value becomes a JSON error body (fields and message, never a stack).

/** Only this raw path prefix selects RPC; everything else goes to the image's fetch. */
export const RPC_PREFIX = "/__rpc__/";
/** `GET` on exactly this path is the runtime's readiness probe (no method has an empty name). */
export const RPC_HEALTH_PATH = RPC_PREFIX;
export const RPC_ERROR_TAG = "~alchemy/rpc/error";
export const RPC_STREAM_ERROR_TAG = "~alchemy/rpc/stream-error";
/** Response header marking a streamed (NDJSON) result. */
export const RPC_STREAM_HEADER = "x-alchemy-rpc-stream";
export const NDJSON_CONTENT_TYPE = "application/x-ndjson";
/**
 * Header the proxy adds and the runtime requires when started with an access secret, so only
 * the proxy (not other local processes or instances) can reach it. Never shown to the image.
 */
export const INSTANCE_SECRET_HEADER = "x-instance-secret";
/**
 * Header the proxy adds for a port other than the runtime's, when it reaches the instance
 * through the runtime's socket: the runtime forwards the request to that port inside the
 * instance. Callers' own copies are stripped at the proxy.
 */
export const INSTANCE_PORT_HEADER = "x-instance-port";

/** The error object inside an envelope: `_tag` if the thrown value had one, its fields, `message`. */
export interface RpcErrorBody {
  readonly _tag?: string;
  readonly message: string;
  readonly [field: string]: unknown;
}

/** Body of a non-2xx RPC answer. */
export interface RpcErrorEnvelope {
  readonly _tag: typeof RPC_ERROR_TAG;
  readonly error: RpcErrorBody;
}

/** Last line of a stream that failed after it started. */
export interface RpcStreamErrorLine {
  readonly _tag: typeof RPC_STREAM_ERROR_TAG;
  readonly error: RpcErrorBody;
}

/** The path that calls `method`. */
export function rpcPath(method: string): string {
  return RPC_PREFIX + encodeURIComponent(method);
}

/** The HTTP status a thrown value declares (`status` 400..599), else 500. */
export function declaredStatus(thrown: unknown): number {
  const status = readField(thrown, "status");
  return Number.isInteger(status) && (status as number) >= 400 && (status as number) <= 599 ? (status as number) : 500;
}

/** Encodes any thrown value; never throws, never includes `stack`. */
export function encodeThrown(thrown: unknown): RpcErrorBody {
  try {
    const body = describe(thrown);
    JSON.stringify(body);
    return body;
  } catch {
    const tag = readField(thrown, "_tag");
    return typeof tag === "string" ? { _tag: tag, message: safeMessage(thrown) } : { message: safeMessage(thrown) };
  }
}

/** An error body in its envelope. */
export function errorEnvelope(error: RpcErrorBody): RpcErrorEnvelope {
  return { _tag: RPC_ERROR_TAG, error };
}

/** JSON of a value with `undefined` (and other unencodable tops) as `null`. */
export function toJson(value: unknown): string {
  return JSON.stringify(value) ?? "null";
}

function describe(thrown: unknown): RpcErrorBody {
  if (typeof thrown !== "object" || thrown === null) return { message: safeMessage(thrown) };
  const fields: Record<string, unknown> = {};
  for (const key of Object.keys(thrown)) {
    if (key === "stack" || key === "_tag" || key === "message") continue;
    fields[key] = (thrown as Record<string, unknown>)[key];
  }
  const tag = readField(thrown, "_tag");
  return { ...(typeof tag === "string" ? { _tag: tag } : {}), ...fields, message: safeMessage(thrown) };
}

function safeMessage(thrown: unknown): string {
  try {
    const message = readField(thrown, "message");
    if (typeof message === "string") return message;
    if (typeof thrown === "object" && thrown !== null) return "Unknown error";
    return String(thrown);
  } catch {
    return "Unknown error";
  }
}

function readField(value: unknown, key: string): unknown {
  if (typeof value !== "object" || value === null) return undefined;
  try {
    return (value as Record<string, unknown>)[key];
  } catch {
    return undefined;
  }
}

/**
 * Signal the host sends the runtime (through the wall) before a checkpoint and after a
 * restore: a wall cannot save a sandbox holding a bound host socket, so the first closes the
 * listener and every connection (the socket file goes with it); the next listens again.
 */
export const CHECKPOINT_SIGNAL = "SIGUSR2";

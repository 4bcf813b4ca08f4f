// The NATS adapter of an operation: decode → validate → call the handler → encode the reply.
// Subscribes in a queue group, so every replica of an actor process shares the subject.
import { headers, type Msg, type MsgHdrs, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { validate as isUuid, version as uuidVersion } from "uuid";
import {
  ApiError,
  compileDecoder,
  ERROR_CODE_HEADER,
  ERROR_TAG_HEADER,
  HttpApiDecodeError,
  IDEMPOTENCY_KEY_HEADER,
  REQUEST_ID_HEADER,
  inputSchema,
  InternalServerError,
  ServiceUnavailable,
  subjectValues,
  subscriptionSubject,
  type InputOf,
  type Operation,
  type SuccessOf,
} from "../schemas/index.ts";
import { JetStreamRequestError, log, recordActor, type BatchPublisher } from "../platform/index.ts";

/** What a handler knows besides its input. */
export interface HandlerContext {
  /** A uuid v4 the caller chose for the record it creates (`Idempotency-Key` header). */
  idempotencyKey?: string;
  /** The request's NATS headers, as received (e.g. `X-Request-Id`, for onward requests). */
  headers?: MsgHdrs;
}

export type Handler<Op extends Operation> = (
  input: InputOf<Op>,
  context: HandlerContext,
) => Promise<SuccessOf<Op>>;

export interface ServeOptions {
  /** Subject prefix (empty for none). */
  prefix: string;
  /** Queue group; replicas with the same group share the load. */
  queue: string;
  /** Sends replies gathered per event-loop turn; without it each reply is its own write. */
  publisher?: BatchPublisher;
}

export function serveOperation<Op extends Operation>(
  nc: NatsConnection,
  op: Op,
  handler: Handler<Op>,
  options: ServeOptions,
): Subscription {
  const decode = compileDecoder<InputOf<Op>>(inputSchema(op));
  const publisher = options.publisher;
  const respond = (msg: Msg, data: string, hdrs?: MsgHdrs) => {
    if (!msg.reply) return;
    if (publisher) publisher.publish({ subject: msg.reply, data, headers: hdrs });
    else msg.respond(data, { headers: hdrs });
  };
  const handle = async (msg: Msg) => {
    const started = performance.now();
    let status = 200;
    try {
      const input = decode(requestInput(op, msg, options.prefix));
      const context = { idempotencyKey: idempotencyKey(op, msg.headers), headers: msg.headers };
      respond(msg, JSON.stringify(await handler(input, context)));
    } catch (err) {
      const failure = toApiError(op, err, msg.headers?.get(REQUEST_ID_HEADER));
      status = failure.status;
      respond(msg, JSON.stringify(failure.body), errorHeaders(failure));
    }
    recordActor(op.name, status, (performance.now() - started) / 1000);
  };
  return nc.subscribe(subscriptionSubject(op, options.prefix), {
    queue: options.queue,
    callback: (err, msg) => {
      if (err) log.error({ op: op.name, err }, "subscription failed");
      else void handle(msg);
    },
  });
}

/** The request body merged with the `{field}` values of the subject. */
function requestInput(op: Operation, msg: Msg, prefix: string): unknown {
  const fields = subjectValues(op, msg.subject, prefix);
  if (!fields) throw decodeFailure([], "subject token is not base64url without padding");
  let body: unknown = {};
  if (msg.data.length > 0) {
    try {
      body = JSON.parse(msg.string());
    } catch {
      throw decodeFailure([], "request body is not valid JSON");
    }
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) return body;
  return { ...(body as object), ...fields };
}

function idempotencyKey(op: Operation, hdrs: MsgHdrs | undefined): string | undefined {
  const key = hdrs?.get(IDEMPOTENCY_KEY_HEADER);
  if (!key || !op.idempotent) return undefined;
  if (!isUuid(key) || uuidVersion(key) !== 4) {
    throw decodeFailure([IDEMPOTENCY_KEY_HEADER], "Idempotency-Key must be a uuid v4");
  }
  return key.toLowerCase();
}

export function decodeFailure(path: string[], message: string): ApiError {
  return HttpApiDecodeError.make({ issues: [{ _tag: "Type", path, message }], message });
}

/** The NATS micro error headers of a failure. */
function errorHeaders(failure: ApiError): MsgHdrs {
  const h = headers();
  h.set(ERROR_CODE_HEADER, String(failure.status));
  h.set(ERROR_TAG_HEADER, failure._tag);
  return h;
}

/** A declared error as it is; storage trouble as 503; anything else logged and a bare 500. */
export function toApiError(op: Operation, err: unknown, requestId?: string): ApiError {
  if (err instanceof ApiError) return err;
  const name = (err as Error | undefined)?.name ?? "";
  const storageDown = err instanceof JetStreamRequestError ? err.code >= 500 : /Timeout|NoResponders|Disconnected|Connection|Closed|Draining/.test(name);
  if (storageDown) {
    log.warn({ op: op.name, requestId, err: name }, "storage unavailable");
    return ServiceUnavailable.make({}, { cause: err });
  }
  log.error({ op: op.name, requestId, err }, "undeclared failure");
  return InternalServerError.make({}, { cause: err });
}

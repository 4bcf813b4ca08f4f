// The NATS adapter of an operation: decode → validate → call the handler → encode the reply;
// `serveApi` serves a whole API from a handler map that must name every operation. Subscribes
// in a queue group, so every replica of an actor process shares the subject.
import type { Msg, MsgHdrs, NatsConnection, Subscription } from "@nats-io/transport-node";
import { validate as isUuid, version as uuidVersion } from "uuid";
import {
  compileDecoder,
  decodeFailure,
  IDEMPOTENCY_KEY_HEADER,
  REQUEST_ID_HEADER,
  inputSchema,
  subjectValues,
  subscriptionSubject,
  type InputOf,
  type Operation,
  type SuccessOf,
  Unauthorized,
} from "../schemas/index.ts";
import { errorHeaders, log, recordActor, toApiError, type BatchPublisher } from "../platform/index.ts";
import type { MicroService } from "./discovery.ts";

/** What a handler knows besides its input. */
export interface HandlerContext {
  /** A uuid v4 the caller chose for the record it creates (`Idempotency-Key` header). */
  idempotencyKey?: string;
  /** The request's NATS headers, as received (e.g. `X-Request-Id`, for onward requests). */
  headers?: MsgHdrs;
  /** Who asks (microVM operations): from `ServeOptions.principal`. */
  principal?: string;
}

export type Handler<Op extends Operation> = (input: InputOf<Op>, context: HandlerContext) => Promise<SuccessOf<Op>>;

/** A handler for every operation of `Api`: one missing, or of another operation's shape, fails to compile. */
export type ApiHandlers<Api extends Record<string, Operation>> = { readonly [K in keyof Api]: Handler<Api[K]> };

export interface ServeOptions {
  /** Subject prefix (empty for none). */
  prefix: string;
  /** Queue group; replicas with the same group share the load. */
  queue: string;
  /** Sends replies gathered per event-loop turn; without it each reply is its own write. */
  publisher?: BatchPublisher;
  /**
   * The caller's principal for a request on this subject; undefined refuses it (401). Only
   * what the subject's permissions guarantee may decide it (NATS does not say who published).
   */
  principal?: (msg: Msg) => string | undefined;
  /** Lists the operation in a NATS micro service (`name`: its endpoint name, default the op's). */
  discovery?: { service: MicroService; name?: string };
}

export interface ApiServeOptions extends Omit<ServeOptions, "queue" | "discovery"> {
  /** The queue group of each operation; `""` subscribes without one (a subject this process serves alone). */
  queue: (op: Operation) => string;
  /** The copy of each operation to serve (`onOwner`, `viaGateway`); default: the contract as it is. */
  serveAs?: (op: Operation) => Operation;
  /** Lists every operation in a NATS micro service, as endpoint `name(op)` (default the op's name). */
  discovery?: { service: MicroService; name?: (op: Operation) => string };
}

/** Serves every operation of `api` with its handler from `handlers`; one subscription each. */
export function serveApi<Api extends Record<string, Operation>>(
  nc: NatsConnection,
  api: Api,
  handlers: ApiHandlers<Api>,
  options: ApiServeOptions,
): Subscription[] {
  const { queue, serveAs, discovery, ...serve } = options;
  // `ApiHandlers` pairs each key's handler with its operation; looked up by key, TypeScript
  // sees only the union of them, so this one widening stands for that pairing.
  const byKey = handlers as unknown as Record<string, Handler<Operation>>;
  return Object.entries(api).map(([key, op]) =>
    serveOperation(nc, serveAs ? serveAs(op) : op, byKey[key]!, {
      ...serve,
      queue: queue(op),
      discovery: discovery && { service: discovery.service, name: discovery.name?.(op) },
    }),
  );
}

export function serveOperation<Op extends Operation>(
  nc: NatsConnection,
  op: Op,
  handler: Handler<Op>,
  options: ServeOptions,
): Subscription {
  const decode = compileDecoder<InputOf<Op>>(inputSchema(op));
  const publisher = options.publisher;
  const stats = options.discovery?.service.addEndpoint(op, {
    name: options.discovery.name,
    prefix: options.prefix,
    queue: options.queue,
  });
  const respond = (msg: Msg, data: string, hdrs?: MsgHdrs) => {
    if (!msg.reply) return;
    if (publisher) publisher.publish({ subject: msg.reply, data, headers: hdrs });
    else msg.respond(data, { headers: hdrs });
  };
  const handle = async (msg: Msg) => {
    const started = performance.now();
    let status = 200;
    let error: string | undefined;
    try {
      const input = decode(requestInput(op, msg, options.prefix));
      const context: HandlerContext = { idempotencyKey: idempotencyKey(op, msg.headers), headers: msg.headers };
      if (options.principal) {
        context.principal = options.principal(msg);
        if (context.principal === undefined) throw Unauthorized.make({});
      }
      respond(msg, JSON.stringify(await handler(input, context)));
    } catch (err) {
      const failure = toApiError(op, err, msg.headers?.get(REQUEST_ID_HEADER));
      status = failure.status;
      error = `${failure.status}:${failure._tag}`;
      respond(msg, JSON.stringify(failure.body), errorHeaders(failure));
    }
    const seconds = (performance.now() - started) / 1000;
    recordActor(op.name, status, seconds);
    stats?.record(seconds, error);
  };
  return nc.subscribe(subscriptionSubject(op, options.prefix), {
    queue: options.queue,
    callback: (err, msg) => {
      if (err) log.error({ op: op.name, err }, "subscription failed");
      // Answering can throw too (a closed connection): that fails this message only.
      else handle(msg).catch((failure: unknown) => log.warn({ op: op.name, err: failure }, "answer not sent"));
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

// The NATS adapter of an operation: decode → validate → call the handler → encode the reply;
// `serveApi` serves a whole API from a handler map that must name every operation. Subscribes
// in a queue group, so every replica of an actor process shares the subject. Placement is the
// adapter's too: an owned operation (placed `byName` or `byHost`) is served on the shared subject
// and on this process's own subjects, every request routed through the owner strategy of its
// placement, so its handler runs only at the owner, with what the owner holds.
import {
  headers as natsHeaders,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type Subscription,
} from "@nats-io/transport-node";
import { v4 as uuidv4, validate as isUuid, version as uuidVersion } from "uuid";
import {
  compileDecoder,
  decodeFailure,
  ERROR_CODE_HEADER,
  ERROR_TAG_HEADER,
  IDEMPOTENCY_KEY_HEADER,
  KEY_FRESH_HEADER,
  IF_MATCH_HEADER,
  PRINCIPAL_HEADER,
  RECORD_HEADER,
  REQUEST_ID_HEADER,
  REVISION_HEADER,
  inputSchema,
  onOwner,
  subjectReader,
  subscriptionSubject,
  type InputOf,
  type Operation,
  type StoredAt,
  StoredAnswer,
  RelayedAnswer,
  type Answer,
  type OperationReply,
  ANONYMOUS,
  type SuccessOf,
  Unauthorized,
} from "../schemas/index.ts";
import {
  errorHeaders,
  log,
  recordActor,
  SpanKind,
  toApiError,
  traced,
  type BatchPublisher,
} from "../platform/index.ts";
import type {
  HandlerContext,
  OwnedKind,
  OwnedKindsOf,
  OwnerStates,
  OwnerStrategies,
  OwnerStrategy,
} from "../placement/index.ts";
import type { MicroService } from "./discovery.ts";

/**
 * The principal a request names in its `PRINCIPAL_HEADER`: for subjects whose permissions let
 * only senders that say it truly publish (a gateway's copies, owners' own subjects).
 */
export const principalHeader = (msg: Msg): string | undefined => msg.headers?.get(PRINCIPAL_HEADER) || undefined;

/** What the owner of `Op`'s key holds, by `States`; `never` for a stateless operation. */
type StateOf<Op extends Operation, States extends OwnerStates> = Op["placement"]["kind"] extends keyof States
  ? States[Op["placement"]["kind"]]
  : never;

/** The context of a handler: an owned operation's also says what its owner holds. */
export type ContextOf<Owner> = [Owner] extends [never] ? HandlerContext : HandlerContext & { readonly owner: Owner };

export type Handler<Op extends Operation, Owner = never> = (
  input: InputOf<Op>,
  context: ContextOf<Owner>,
) => Promise<Answer<SuccessOf<Op>>>;

/**
 * A handler for every operation of `Api`: one missing, or of another operation's shape, fails
 * to compile. With `States`, an owned operation's handler is the owner's side only: it gets
 * what the owner holds (`context.owner`), and the adapter routes the request there first.
 */
export type ApiHandlers<Api extends Record<string, Operation>, States extends OwnerStates = Record<never, never>> = {
  readonly [K in keyof Api]: Handler<Api[K], StateOf<Api[K], States>>;
};

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
  /** The copy of each operation to serve (`viaGateway`); default: the contract as it is. */
  serveAs?: (op: Operation) => Operation;
  /** Lists every operation in a NATS micro service, as endpoint `name(op)` (default the op's name). */
  discovery?: { service: MicroService; name?: (op: Operation) => string };
  /**
   * Serve the owned operations on this process's own subjects too (default true); false for a
   * second copy of an API (`viaGateway`) whose own subjects the first serves.
   */
  ownSubjects?: boolean;
}

/** `owners`: the owner strategy of each placement the API uses; none for an API without owners. */
export type OwnersOption<Api extends Record<string, Operation>, States extends OwnerStates> = [
  OwnedKindsOf<Api>,
] extends [never]
  ? { owners?: undefined }
  : { owners: OwnerStrategies<Api, States> };

/**
 * Serves every operation of `api` with its handler from `handlers`: a stateless one on its
 * subject, an owned one on its subject and on this process's own (`onOwner`), each request
 * routed through its placement's owner strategy. An idempotent owned request's record id is
 * fixed before any routing, so a request passed on twice still creates one record.
 */
/** The subscriptions of a served API: its shared subjects', and this process's own subjects' (owned operations). */
export interface ServedApi {
  readonly shared: Subscription[];
  readonly own: Subscription[];
}

export function serveApi<Api extends Record<string, Operation>, States extends OwnerStates = Record<never, never>>(
  nc: NatsConnection,
  api: Api,
  handlers: ApiHandlers<Api, States>,
  options: ApiServeOptions & OwnersOption<Api, States>,
): ServedApi {
  const { queue, serveAs, discovery, owners, ownSubjects = true, ...serve } = options;
  // `ApiHandlers` pairs each key's handler with its operation; looked up by key, TypeScript
  // sees only the union of them, so this one widening stands for that pairing.
  const byKey = handlers as unknown as Record<string, (input: unknown, context: unknown) => Promise<unknown>>;
  const strategies = (owners ?? {}) as Partial<Record<OwnedKind, OwnerStrategy<unknown>>>;
  const served = { shared: [] as Subscription[], own: [] as Subscription[] };
  for (const [key, op] of Object.entries(api)) {
    const handler = byKey[key]!;
    const kind = op.placement.kind;
    const target = serveAs ? serveAs(op) : op;
    const shared = {
      ...serve,
      queue: queue(op),
      discovery: discovery && { service: discovery.service, name: discovery.name?.(op) },
    };
    if (kind === "stateless") {
      served.shared.push(serveOperation(nc, target, handler, shared));
      continue;
    }
    const strategy = strategies[kind];
    if (!strategy) throw new TypeError(`${op.name} is placed ${kind}: serveApi needs that owner strategy`);
    const routed =
      (own: boolean) =>
      (input: InputOf<Operation>, context: HandlerContext): Promise<unknown> => {
        const fixed =
          op.idempotent && context.idempotencyKey === undefined
            ? { ...context, idempotencyKey: uuidv4(), keyFresh: true }
            : context;
        return strategy.route(op, input, fixed, own, (owner, routed) => handler(input, { ...routed, owner }));
      };
    if (ownSubjects) {
      // This process's own subjects first: a request routed here must find it answering.
      served.own.push(
        serveOperation(nc, onOwner(op, strategy.ownerId), routed(true), {
          ...serve,
          principal: strategy.principal ?? serve.principal,
          queue: strategy.ownQueue,
          discovery: discovery && { service: discovery.service, name: `${op.name}${strategy.endpointSuffix}` },
        }),
      );
    }
    served.shared.push(serveOperation(nc, target, routed(false), shared));
  }
  return served;
}

export function serveOperation<Op extends Operation>(
  nc: NatsConnection,
  op: Op,
  handler: Handler<Op> | ((input: InputOf<Op>, context: HandlerContext) => Promise<unknown>),
  options: ServeOptions,
): Subscription {
  const decode = compileDecoder<InputOf<Op>>(inputSchema(op));
  const readSubject = subjectReader(op, options.prefix);
  const publisher = options.publisher;
  const stats = options.discovery?.service.addEndpoint(op, {
    name: options.discovery.name,
    prefix: options.prefix,
    queue: options.queue,
  });
  const respond = (msg: Msg, data: string | Uint8Array, hdrs?: MsgHdrs) => {
    if (!msg.reply) return;
    if (publisher) publisher.publish({ subject: msg.reply, data, headers: hdrs });
    else msg.respond(data, { headers: hdrs });
  };
  const handle = async (msg: Msg) => {
    const started = performance.now();
    let reply: EncodedReply;
    try {
      const input = decode(requestInput(readSubject, msg));
      const principal = options.principal ? options.principal(msg) : ANONYMOUS;
      if (principal === undefined) throw Unauthorized.make({});
      const context = contextOf(op, (name) => msg.headers?.get(name), principal, msg.headers);
      // A child of the caller's span (the trace context in the request's headers).
      reply = encodeAnswer(
        await traced(`handle ${op.name}`, SpanKind.SERVER, msg.headers, () => handler(input, context)),
      );
    } catch (err) {
      reply = encodeFailure(op, err, msg.headers?.get(REQUEST_ID_HEADER));
    }
    respond(msg, reply.data, reply.headers);
    const seconds = (performance.now() - started) / 1000;
    recordActor(op.name, reply.status, seconds);
    stats?.record(seconds, reply.error);
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

/**
 * A handler as a gateway in the same process calls it: what `serveOperation` does with a request
 * (its context read from the same headers, the answer encoded as its reply, a failure as its
 * error, the time recorded), without the trip through NATS and back. `input` is decoded already
 * (the gateway decodes with the same schema); `headers` are those the gateway would send, its
 * caller's principal among them (`PRINCIPAL_HEADER`).
 */
export function inProcessOperation<Op extends Operation>(
  op: Op,
  handler: Handler<Op> | ((input: InputOf<Op>, context: HandlerContext) => Promise<unknown>),
): (input: InputOf<Op>, headers: Readonly<Record<string, string>>) => Promise<OperationReply> {
  return async (input, headers) => {
    const started = performance.now();
    let reply: EncodedReply;
    try {
      const principal = headers[PRINCIPAL_HEADER];
      if (!principal) throw Unauthorized.make({});
      const context = contextOf(op, (name) => headers[name], principal);
      reply = encodeAnswer(
        await traced(`handle ${op.name}`, SpanKind.INTERNAL, undefined, () => handler(input, context)),
      );
    } catch (err) {
      reply = encodeFailure(op, err, headers[REQUEST_ID_HEADER]);
    }
    recordActor(op.name, reply.status, (performance.now() - started) / 1000);
    const data = typeof reply.data === "string" ? Buffer.from(reply.data) : reply.data;
    const { stored } = reply;
    return stored
      ? { status: reply.status, data, stored: { record: `${stored.bucket}.${stored.key}`, revision: stored.revision } }
      : { status: reply.status, data };
  };
}

/** A request's handler context, from its headers (`header` reads one by name) and its principal. */
function contextOf(
  op: Operation,
  header: (name: string) => string | undefined,
  principal: string,
  headers?: MsgHdrs,
): HandlerContext {
  return {
    idempotencyKey: idempotencyKey(op, header(IDEMPOTENCY_KEY_HEADER)),
    keyFresh: op.idempotent === true && header(KEY_FRESH_HEADER) === "1",
    headers,
    ifMatch: ifMatchOf(header(IF_MATCH_HEADER)),
    principal,
  };
}

/** A reply as a handler's answer makes it: its status, bytes and the headers that say what it is. */
interface EncodedReply {
  readonly status: number;
  readonly data: string | Uint8Array;
  readonly headers?: MsgHdrs;
  /** The stored record the answer is. */
  readonly stored?: StoredAt;
  /** `<status>:<_tag>` of a failure, for the service's stats. */
  readonly error?: string;
}

/** The reply of an answer: a stored record with its headers, a relayed answer's own bytes, or JSON. */
function encodeAnswer(answer: unknown): EncodedReply {
  if (answer instanceof StoredAnswer)
    return {
      status: 200,
      data: JSON.stringify(answer.value),
      headers: storedHeaders(answer.stored),
      stored: answer.stored,
    };
  if (!(answer instanceof RelayedAnswer)) return { status: 200, data: JSON.stringify(answer) };
  if (answer.status >= 200 && answer.status <= 299) return { status: 200, data: answer.body };
  return {
    status: answer.status,
    data: answer.body,
    headers: relayedErrorHeaders(answer),
    error: `${answer.status}:${answer.tag}`,
  };
}

/** The reply of a failure: its declared error (an undeclared one logged and answered 500). */
function encodeFailure(op: Operation, err: unknown, requestId: string | undefined): EncodedReply {
  const failure = toApiError(op, err, requestId);
  return {
    status: failure.status,
    data: JSON.stringify(failure.body),
    headers: errorHeaders(failure),
    error: `${failure.status}:${failure._tag}`,
  };
}

/** The request body merged with the `{field}` values of the subject. */
function requestInput(readSubject: (subject: string) => Record<string, string> | undefined, msg: Msg): unknown {
  const fields = readSubject(msg.subject);
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
  // Into the parsed body, this request's own object: a spread of the two into a new one took
  // V8's slow path (about 1 µs a request).
  return Object.assign(body, fields);
}

/**
 * The revision `If-Match` names: `"12"`, `W/"12"` or `12`; `*` (any) is none. Anything else
 * names no revision a record can be at, so the write is refused (412).
 */
function ifMatchOf(header: string | undefined): number | undefined {
  const given = header?.trim();
  if (!given || given === "*") return undefined;
  const digits = /^(?:W\/)?"?(\d{1,15})"?$/.exec(given)?.[1];
  return digits === undefined ? -1 : Number(digits);
}

/** The NATS micro error headers of a relayed answer that is not a success. */
function relayedErrorHeaders(answer: RelayedAnswer): MsgHdrs {
  const h = natsHeaders();
  h.set(ERROR_CODE_HEADER, String(answer.status));
  h.set(ERROR_TAG_HEADER, answer.tag);
  return h;
}

function storedHeaders(stored: StoredAt): MsgHdrs {
  const h = natsHeaders();
  h.set(REVISION_HEADER, String(stored.revision));
  h.set(RECORD_HEADER, `${stored.bucket}.${stored.key}`);
  return h;
}

function idempotencyKey(op: Operation, key: string | undefined): string | undefined {
  if (!key || !op.idempotent) return undefined;
  if (!isUuid(key) || uuidVersion(key) !== 4) {
    throw decodeFailure([IDEMPOTENCY_KEY_HEADER], "Idempotency-Key must be a uuid v4");
  }
  return key.toLowerCase();
}

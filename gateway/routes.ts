// HTTP routes derived from operation contracts: decode path, query and body → validate →
// dispatch over NATS (placement's `dispatch`) → send the actor's JSON as it is (no re-encoding).
import type { IncomingMessage, ServerResponse } from "node:http";
import polka, { type Request } from "polka";
import { v4 as uuidv4 } from "uuid";
import {
  API_KEY_ID_HEADER,
  answersNoContent,
  compileDecoder,
  decodeFailure,
  IDEMPOTENCY_KEY_HEADER,
  KEY_FRESH_HEADER,
  IF_MATCH_HEADER,
  PRINCIPAL_HEADER,
  REQUEST_ID_HEADER,
  UnsupportedMediaType,
  inputSchema,
  RouteNotFound,
  sendsPrincipal,
  type Operation,
} from "../schemas/index.ts";
import { log, recordHttp, SpanKind, toApiError, traceAttribute, traced, type NatsHandle } from "../platform/index.ts";
import type { LocalReads } from "./local-reads.ts";
import { apiKeyIdOfRequest, principalOfRequest } from "./api-keys.ts";
import type { OpenStreams } from "./open-streams.ts";
import { readJsonBody } from "./body.ts";
import { parseUrl } from "./query.ts";
import { requestId } from "./request-id.ts";
import { sendError, sendJson, sendNoContent, setRetryAfter } from "./respond.ts";
import { follow } from "./follow.ts";
import { dispatcher, type Budget, type Dispatch } from "../placement/index.ts";

export interface RouteOptions {
  nats: NatsHandle;
  prefix: string;
  /** Largest accepted body in bytes (also kept below the NATS max payload). */
  bodyLimit: number;
  /** Time for the actor's answer, retries included. */
  requestTimeoutMs: number;
  /** Time for one attempt of a repeatable request (reads, creates with an idempotency key). */
  attemptTimeoutMs?: number;
  /** Reads the gateway serves itself from KV instead of asking an actor. */
  localReads?: LocalReads;
  /** Sends each request where it runs (default: on its shared subject, `dispatcher(nats, prefix)`). */
  dispatch?: Dispatch;
  /** Every POST must say `content-type: application/json`, even without a body (else 415). */
  jsonOnly?: boolean;
  /** Aborted when the server stops: followed reads end then. */
  stopping?: AbortSignal;
  /** Followed reads and long polls by the API key that opened them (a revoked key ends them). */
  openStreams?: OpenStreams;
}

/** A polka app serving `operations`; unknown routes and methods are 404 RouteNotFound. */
export function buildRouter(operations: readonly Operation[], options: RouteOptions) {
  const app = polka({
    onNoMatch: (req: IncomingMessage, res: ServerResponse) =>
      sendError(res, RouteNotFound.make({ message: `no route for ${req.method} ${pathOf(req)}` })),
    onError: (err: unknown, _req: IncomingMessage, res: ServerResponse) => sendError(res, err),
  });
  app.parse = parseUrl;
  for (const op of operations) {
    app.add(op.http.method, op.http.path, operationRoute(op, options));
  }
  return app;
}

function operationRoute(op: Operation, options: RouteOptions) {
  const decode = compileDecoder(inputSchema(op));
  const noContent = answersNoContent(op);
  const localRead = options.localReads?.forOperation(op);
  const dispatch = options.dispatch ?? dispatcher(options.nats, options.prefix);
  const attemptMs = options.attemptTimeoutMs ?? 1_500;
  // Who asks (`Microvm-Principal`), where the contract's API takes it.
  const principal = sendsPrincipal(op);
  const spanName = `${op.http.method} ${op.http.path}`;
  const spanAttributes = { "operation.name": op.name };
  return (req: Request, res: ServerResponse) =>
    traced(spanName, SpanKind.SERVER, req.headers, () => answer(req, res), spanAttributes);

  /** The NATS headers of a request to the actors: its id, and what the operation takes of HTTP's. */
  function requestHeaders(req: Request, id: string): Record<string, string> {
    const headers: Record<string, string> = { [REQUEST_ID_HEADER]: id };
    if (op.idempotent) {
      const given = req.headers["idempotency-key"];
      if (typeof given === "string" && given !== "") headers[IDEMPOTENCY_KEY_HEADER] = given;
      else {
        // One key for every attempt of this request, and none other's: see KEY_FRESH_HEADER.
        headers[IDEMPOTENCY_KEY_HEADER] = uuidv4();
        headers[KEY_FRESH_HEADER] = "1";
      }
    }
    if (principal) {
      headers[PRINCIPAL_HEADER] = principalOfRequest(req);
      const keyId = apiKeyIdOfRequest(req);
      if (keyId) headers[API_KEY_ID_HEADER] = keyId;
    }
    const ifMatch = req.headers["if-match"];
    if (ifMatch && op.http.method !== "GET") headers[IF_MATCH_HEADER] = ifMatch;
    return headers;
  }

  async function answer(req: Request, res: ServerResponse) {
    const started = performance.now();
    const id = requestId(req);
    traceAttribute("request.id", id);
    let held: Budget["held"];
    /** Aborted when the request's API key is revoked while it is held (already answered then). */
    let revoked: AbortSignal | undefined;
    try {
      if (options.jsonOnly && req.method === "POST") requireJsonType(req);
      const payload = await readPayload(req, op, bodyLimit(options, op));
      const input = decode({ ...req.params, ...req.query, ...payload });
      const following = op.follow !== undefined && (input as { follow?: unknown }).follow !== undefined;
      // A request that waits (RunMicrovm's `wait`, a long poll) is given up when its client leaves.
      const waitMs = op.waitMsOf?.(input as Record<string, unknown>);
      if (following || waitMs !== undefined) {
        const keyId = apiKeyIdOfRequest(req);
        revoked = keyId === undefined ? undefined : options.openStreams?.hold(keyId, res);
        const left = clientLeft(res);
        held = { signal: revoked ? AbortSignal.any([left, revoked]) : left, prefix: options.prefix };
      }
      if (following) {
        const headers = requestHeaders(req, id);
        await follow(op.follow!, res, options.stopping, (next) =>
          dispatch(op, next, headers, { timeoutMs: options.requestTimeoutMs, waitMs: op.waitMsOf?.(next), held }),
        )(input as Record<string, unknown>);
      } else if (localRead) {
        // polka's `originalUrl`: the request's path and query (a `#fragment` dropped).
        const answer = await localRead(input, req.originalUrl, principalOfRequest(req)).catch((err: unknown) => {
          throw toApiError(op, err, id);
        });
        sendJson(res, 200, answer.body, answer.revision);
      } else {
        const headers = requestHeaders(req, id);
        const reply = await dispatch(op, input, headers, {
          timeoutMs: op.timeoutMs ?? options.requestTimeoutMs,
          waitMs,
          attemptMs,
          held,
        });
        const stored = reply.status === 200 ? reply.stored : undefined;
        // Seen before it is answered: a read here after this answer never finds what it replaced.
        if (stored && op.http.method !== "GET") options.localReads?.written(stored.record, stored.revision);
        // A refusal that names its wait (TaskObjectBusy) says it as HTTP does too.
        if (reply.status === 429) setRetryAfter(res, reply.data);
        if (reply.status === 200 && noContent) sendNoContent(res);
        else sendJson(res, reply.status, reply.data, stored?.revision);
      }
    } catch (err) {
      // Nobody to answer: nginx's 499 (client closed request) for the metrics and the log; a
      // revoked key's answer was given when it was revoked.
      if (held?.signal.aborted) {
        if (!revoked?.aborted) res.statusCode = 499;
      } else sendError(res, err, { op: op.name, requestId: id });
    }
    const seconds = (performance.now() - started) / 1000;
    recordHttp(op.api, op.name, res.statusCode, seconds);
    traceAttribute("http.response.status_code", res.statusCode);
    if (log.isLevelEnabled("debug"))
      log.debug({ requestId: id, op: op.name, status: res.statusCode, ms: seconds * 1000 }, "request");
  }
}

/**
 * The payload fields of a request: its JSON body, an object of them; or, for an operation whose
 * body is one field (`op.body`), that field (absent, its default, when the body is empty).
 */
async function readPayload(req: IncomingMessage, op: Operation, limit: number): Promise<Record<string, unknown>> {
  if (!op.payload) return {};
  if (op.body !== undefined) {
    const value = await readJsonBody(req, limit, true);
    return value === undefined ? {} : { [op.body]: value };
  }
  const payload = await readJsonBody(req, limit);
  if (payload === null || typeof payload !== "object" || Array.isArray(payload)) throw notAnObject(payload);
  return payload as Record<string, unknown>;
}

/**
 * 415 unless the content type is `application/json`: a browser sends a cross-site POST without
 * a preflight only with a form or text type (or none), so such a POST never reaches an actor.
 */
function requireJsonType(req: IncomingMessage): void {
  const type = req.headers["content-type"]?.split(";", 1)[0]?.trim().toLowerCase();
  if (type !== "application/json") throw UnsupportedMediaType.make({});
}

/** Aborts when the client goes away before its answer is sent in full. */
function clientLeft(res: ServerResponse): AbortSignal {
  const left = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) left.abort();
  });
  return left.signal;
}

function bodyLimit(options: RouteOptions, op: Operation): number {
  const maxPayload = options.nats.nc.info?.max_payload ?? 1024 * 1024;
  // Room for headers and the record's id around the caller's fields.
  return Math.min(Math.max(options.bodyLimit, op.maxBodyBytes ?? 0), maxPayload - 8 * 1024);
}

function notAnObject(value: unknown) {
  const actual = Array.isArray(value) ? "an array" : value === null ? "null" : typeof value;
  return decodeFailure([], `Expected an object, actual ${actual}`);
}

function pathOf(req: IncomingMessage): string {
  const path = (req.url ?? "/").split("?", 1)[0]!;
  return path.length > 200 ? `${path.slice(0, 200)}...` : path;
}

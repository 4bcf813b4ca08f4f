// HTTP routes derived from operation contracts: decode path, query and body → validate →
// forward over NATS → send the actor's JSON as it is (no re-encoding).
import type { IncomingMessage, ServerResponse } from "node:http";
import polka, { type Request } from "polka";
import { v4 as uuidv4 } from "uuid";
import {
  compileDecoder,
  HttpApiDecodeError,
  IDEMPOTENCY_KEY_HEADER,
  REQUEST_ID_HEADER,
  inputSchema,
  requestSubject,
  RouteNotFound,
  requestBody,
  type Operation,
} from "../schemas/index.ts";
import { log, recordHttp, type NatsHandle } from "../platform/index.ts";
import { toApiError } from "../actors/index.ts";
import type { LocalReads } from "./local-reads.ts";
import { isPlaced, type OwnerRouting } from "./owner-routing.ts";
import { readJsonBody } from "./body.ts";
import { requestId } from "./request-id.ts";
import { sendError, sendJson } from "./respond.ts";
import { forward } from "./transport.ts";

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
  /** Sends task-object requests to the owning process directly when it is known. */
  ownerRouting?: OwnerRouting;
}

/** A polka app serving `operations`; unknown routes and methods are 404 RouteNotFound. */
export function buildRouter(operations: readonly Operation[], options: RouteOptions) {
  const app = polka({
    onNoMatch: (req: IncomingMessage, res: ServerResponse) =>
      sendError(res, RouteNotFound.make({ message: `no route for ${req.method} ${pathOf(req)}` })),
    onError: (err: unknown, _req: IncomingMessage, res: ServerResponse) => sendError(res, err),
  });
  for (const op of operations) {
    app.add(op.http.method, op.http.path, operationRoute(op, options));
  }
  return app;
}

function operationRoute(op: Operation, options: RouteOptions) {
  const decode = compileDecoder(inputSchema(op));
  const repeatable = op.http.method === "GET" || op.idempotent === true;
  const localRead = options.localReads?.forOperation(op);
  const ownerRouting = isPlaced(op) ? options.ownerRouting : undefined;
  const attemptMs = repeatable ? (options.attemptTimeoutMs ?? 1_500) : undefined;
  return async (req: Request, res: ServerResponse) => {
    const started = performance.now();
    const id = requestId(req);
    try {
      const payload = op.payload ? await readJsonBody(req, bodyLimit(options)) : {};
      if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
        throw notAnObject(payload);
      }
      const input = decode({ ...req.params, ...req.query, ...payload });
      if (localRead) {
        sendJson(res, 200, await localRead(input).catch((err: unknown) => {
          throw toApiError(op, err, id);
        }));
      } else {
        const headers: Record<string, string> = { [REQUEST_ID_HEADER]: id };
        if (op.idempotent) headers[IDEMPOTENCY_KEY_HEADER] = idempotencyKey(req);
        const body = requestBody(op, input);
        // Straight to the owner when known (placed operations are all repeatable); else, or
        // when it did not serve, through the shared subject, where any actor routes it.
        const direct = ownerRouting && (await ownerRouting.tryOwner(op, input, body, headers, attemptMs ?? options.requestTimeoutMs));
        const timeoutMs = Math.max(1, options.requestTimeoutMs - (performance.now() - started));
        const reply = direct || (await forward(options.nats, requestSubject(op, input, options.prefix), body, { timeoutMs, attemptMs, headers }));
        sendJson(res, reply.status, reply.data);
      }
    } catch (err) {
      sendError(res, err, { op: op.name, requestId: id });
    }
    const seconds = (performance.now() - started) / 1000;
    recordHttp(op.api, op.name, res.statusCode, seconds);
    if (log.isLevelEnabled("debug")) log.debug({ requestId: id, op: op.name, status: res.statusCode, ms: seconds * 1000 }, "request");
  };
}

/** The caller's `Idempotency-Key` (checked by the actor) or a fresh one for this request. */
function idempotencyKey(req: IncomingMessage): string {
  const given = req.headers["idempotency-key"];
  return typeof given === "string" && given !== "" ? given : uuidv4();
}

function bodyLimit(options: RouteOptions): number {
  const maxPayload = options.nats.nc.info?.max_payload ?? 1024 * 1024;
  // Room for headers and the record's id around the caller's fields.
  return Math.min(options.bodyLimit, maxPayload - 8 * 1024);
}

function notAnObject(value: unknown) {
  const actual = Array.isArray(value) ? "an array" : value === null ? "null" : typeof value;
  const message = `Expected an object, actual ${actual}`;
  return HttpApiDecodeError.make({ issues: [{ _tag: "Type", path: [], message }], message });
}

function pathOf(req: IncomingMessage): string {
  const path = (req.url ?? "/").split("?", 1)[0]!;
  return path.length > 200 ? `${path.slice(0, 200)}...` : path;
}

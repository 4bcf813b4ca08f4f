// OpenAPI 3.1 documents derived from the operation contracts (never written by hand).
import type { TObject, TSchema } from "@sinclair/typebox";
import {
  commonErrors,
  PayloadTooLarge,
  PreconditionFailed,
  Unauthorized,
  UnsupportedMediaType,
  type ErrorDef,
} from "./errors.ts";
import { answersNoContent } from "./replies.ts";
import { Task } from "./tasks.ts";
import type { Operation } from "./types.ts";

type Json = Record<string, unknown>;

/** A plain JSON Schema: TypeBox's symbol keys dropped. */
function plain(schema: TSchema): Json {
  return JSON.parse(JSON.stringify(schema)) as Json;
}

function parameters(op: Operation): Json[] {
  const list: Json[] = [];
  const add = (part: TObject | undefined, location: "path" | "query") => {
    for (const [name, schema] of Object.entries(part?.properties ?? {})) {
      list.push({
        name,
        in: location,
        required: location === "path" || (part!.required ?? []).includes(name),
        schema: plain(schema),
        ...(schema.description ? { description: schema.description } : {}),
      });
    }
  };
  add(op.params, "path");
  add(op.query, "query");
  if (op.idempotent) {
    list.push({
      name: "Idempotency-Key",
      in: "header",
      required: false,
      description:
        op.http.method === "POST"
          ? "A uuid v4 that becomes the new record's id; repeating the request answers the same record."
          : "A uuid v4 sent with the write; repeating the request answers as the first did, and writes once.",
      schema: { type: "string", format: "uuid" },
    });
  }
  if (op.errors.includes(PreconditionFailed)) {
    list.push({
      name: "If-Match",
      in: "header",
      required: false,
      description: 'The revision (an ETag, `"12"`) the record must still be at, else 412 PreconditionFailed.',
      schema: { type: "string" },
    });
  }
  return list;
}

/** A Task answer carries its revision. */
const etagHeader = {
  ETag: { description: 'The task\'s revision (`"12"`), for If-Match.', schema: { type: "string" } },
};

function errorResponses(op: Operation): Json {
  const errors: ErrorDef[] = [...op.errors, ...commonErrors];
  if (op.payload) errors.push(PayloadTooLarge, UnsupportedMediaType);
  const byStatus = new Map<number, ErrorDef[]>();
  for (const error of errors) byStatus.set(error.status, [...(byStatus.get(error.status) ?? []), error]);
  const responses: Json = {};
  for (const [status, defs] of [...byStatus].sort(([a], [b]) => a - b)) {
    const schemas = defs.map((d) => plain(d.schema));
    responses[String(status)] = {
      description: defs.map((d) => d.tag).join(" | "),
      content: { "application/json": { schema: schemas.length === 1 ? schemas[0] : { oneOf: schemas } } },
    };
  }
  return responses;
}

const unauthorizedResponse = {
  "401": { description: Unauthorized.tag, content: { "application/json": { schema: plain(Unauthorized.schema) } } },
};

/** The request body: the payload's fields, or the one field that is the whole body (`op.body`, optional). */
function requestBody(op: Operation): Json {
  if (!op.payload) return {};
  const field = op.body === undefined ? undefined : op.payload.properties[op.body];
  const schema = plain(field ?? op.payload);
  return { requestBody: { required: field === undefined, content: { "application/json": { schema } } } };
}

/** The OpenAPI path of a route: `/:id` → `/{id}`. */
export function openApiPath(path: string): string {
  return path.replace(/:(\w+)/g, "{$1}");
}

export interface OpenApiInfo {
  title: string;
  version: string;
  description?: string;
}

/**
 * An OpenAPI 3.1 document for one HTTP API. It declares the bearer scheme of API keys;
 * `apiKeys` (keys on) makes it required and adds the 401 answer.
 */
export function openApiDocument(operations: readonly Operation[], info: OpenApiInfo, { apiKeys = false } = {}): Json {
  const paths: Record<string, Json> = {};
  for (const op of operations) {
    const item = (paths[openApiPath(op.http.path)] ??= {});
    item[op.http.method.toLowerCase()] = {
      operationId: op.name,
      summary: op.summary,
      "x-nats-subject": op.subject,
      parameters: parameters(op),
      ...requestBody(op),
      responses: {
        ...(answersNoContent(op)
          ? { "204": { description: "Success, no body" } }
          : {
              "200": {
                description: "Success",
                ...(op.success === Task ? { headers: etagHeader } : {}),
                content: { "application/json": { schema: plain(op.success) } },
              },
            }),
        ...errorResponses(op),
        ...(apiKeys ? unauthorizedResponse : {}),
      },
    };
  }
  const securitySchemes = {
    bearerAuth: { type: "http", scheme: "bearer", description: "An API key: `taskctl apikey create <principal>`" },
  };
  // `{}`: no key needed (API keys off); Swagger UI still offers to send one.
  const security = apiKeys ? [{ bearerAuth: [] }] : [{}, { bearerAuth: [] }];
  return { openapi: "3.1.0", info, security, components: { securitySchemes }, paths };
}

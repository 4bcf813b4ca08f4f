// Ajv validators compiled once per operation, and the mapping of Ajv errors to the
// `HttpApiDecodeError` body (Effect's issue shape).
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import addFormatsModule from "ajv-formats";
import { Type, type TObject, type TProperties } from "@sinclair/typebox";
import { type ApiError, HttpApiDecodeError } from "./errors.ts";
import type { Operation } from "./types.ts";

// ajv-formats ships CommonJS; under ESM its default export is the module object.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as unknown as (
  ajv: Ajv,
) => Ajv;

/** One Ajv instance for the process: validators are compiled once and reused. */
export const ajv = new Ajv({
  allErrors: true,
  verbose: true,
  useDefaults: true,
  removeAdditional: true,
  strict: false,
});
addFormats(ajv);

/** The schema of an operation's whole input: params, query and payload merged. */
export function inputSchema(op: Operation): TObject {
  const properties: TProperties = {};
  for (const part of [op.params, op.query, op.payload]) {
    for (const [key, schema] of Object.entries(part?.properties ?? {})) {
      properties[key] = schema;
    }
  }
  // A payload that needs at least one of its (optional) fields, e.g. a PATCH's.
  const atLeastOne = op.payload?.minProperties
    ? { anyOf: Object.keys(op.payload.properties).map((key) => ({ required: [key] })) }
    : {};
  return Type.Object(properties, { additionalProperties: false, ...atLeastOne });
}

/** A compiled check that throws `HttpApiDecodeError` and returns the input, defaults applied. */
export type Decoder<T = Record<string, unknown>> = (value: unknown) => T;

export function compileDecoder<T = Record<string, unknown>>(schema: TObject): Decoder<T> {
  const validate = ajv.compile(schema);
  return (value) => {
    if (validate(value)) return value as T;
    throw decodeError(validate, value);
  };
}

/** A 400 `HttpApiDecodeError` with one `Type` issue at `path` (what a schema cannot say). */
export function decodeFailure(path: (string | number)[], message: string): ApiError {
  return HttpApiDecodeError.make({ issues: [{ _tag: "Type", path, message }], message });
}

function decodeError(validate: ValidateFunction, value: unknown): ApiError {
  const issues = (validate.errors ?? []).map(toIssue);
  const message = issues.length
    ? issues.map((i) => `${JSON.stringify(i.path)}: ${i.message}`).join("; ")
    : `Expected an object, actual ${describe(value)}`;
  return HttpApiDecodeError.make({ issues, message });
}

type Issue = { _tag: string; path: (string | number)[]; message: string };

function toIssue(error: ErrorObject): Issue {
  const path = error.instancePath
    .split("/")
    .slice(1)
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"))
    .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
  switch (error.keyword) {
    case "required":
      return { _tag: "Missing", path: [...path, error.params.missingProperty], message: "is missing" };
    case "type":
      return { _tag: "Type", path, message: `Expected ${error.params.type}, actual ${describe(error.data)}` };
    default:
      return { _tag: "Type", path, message: `${error.message ?? "is invalid"}, actual ${describe(error.data)}` };
  }
}

/** A short, bounded rendering of a value for messages: never echoes large input back. */
function describe(value: unknown): string {
  if (value === undefined) return "undefined";
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = typeof value;
  }
  return text.length > 64 ? `${text.slice(0, 61)}...` : text;
}

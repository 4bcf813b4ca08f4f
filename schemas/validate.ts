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
  const issues = issuesOf(validate.errors ?? []);
  const message = issues.length
    ? issues.map((i) => (i.path.length ? `${JSON.stringify(i.path)}: ${i.message}` : i.message)).join("; ")
    : `Expected an object, actual ${describe(value)}`;
  return HttpApiDecodeError.make({ issues, message });
}

type Issue = { _tag: string; path: (string | number)[]; message: string };
/** One failure before it is worded: what was expected (`problem`), and what came instead. */
type Finding = { _tag: string; path: (string | number)[]; problems: string[]; actual?: string };
type Schema = Record<string, unknown>;

/**
 * One issue per field: a union's failure stands for the failures of its branches (Ajv reports
 * each branch's, then the union's), and the failures of one path are worded as one message.
 */
function issuesOf(errors: readonly ErrorObject[]): Issue[] {
  const unions = errors.filter((e) => e.keyword === "anyOf" || e.keyword === "oneOf").map((e) => `${e.schemaPath}/`);
  const byPath = new Map<string, Finding>();
  for (const error of errors) {
    if (unions.some((union) => error.schemaPath.startsWith(union))) continue;
    const finding = toFinding(error);
    const key = JSON.stringify(finding.path);
    const seen = byPath.get(key);
    if (!seen) byPath.set(key, finding);
    else if (!seen.problems.includes(finding.problems[0]!)) seen.problems.push(...finding.problems);
  }
  return [...byPath.values()].map(({ _tag, path, problems, actual }) => ({
    _tag,
    path,
    message: actual === undefined ? problems.join(" and ") : `${problems.join(" and ")}, actual ${actual}`,
  }));
}

function toFinding(error: ErrorObject): Finding {
  const path = error.instancePath
    .split("/")
    .slice(1)
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"))
    .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
  const actual = describe(error.data);
  switch (error.keyword) {
    case "required":
      return { _tag: "Missing", path: [...path, error.params.missingProperty], problems: ["is missing"] };
    case "type":
      return { _tag: "Type", path, problems: [`Expected ${error.params.type}`], actual };
    case "anyOf":
    case "oneOf": {
      const union = error.parentSchema as Schema;
      const needed = neededFields(union[error.keyword] as Schema[]);
      // A payload that needs at least one of its fields (a PATCH's): name them, not the input.
      if (needed) return { _tag: "Missing", path, problems: [`send ${orList(needed)}`] };
      return { _tag: "Type", path, problems: [`Expected ${expected(union)}`], actual };
    }
    default:
      return { _tag: "Type", path, problems: [error.message ?? "is invalid"], actual };
  }
}

/** The field names of a union whose every branch only requires one field; else undefined. */
function neededFields(branches: readonly Schema[]): string[] | undefined {
  const fields = branches.map((b) =>
    Object.keys(b).length === 1 && Array.isArray(b.required) && b.required.length === 1 ? String(b.required[0]) : "",
  );
  return fields.every(Boolean) ? fields : undefined;
}

/** What a schema accepts, in words: `an integer from 1 to 1000`, `"1" or "true"`. */
function expected(schema: Schema): string {
  const branches = (schema.anyOf ?? schema.oneOf) as Schema[] | undefined;
  if (branches) {
    // A number's HTTP query form (digits matching a pattern) says nothing the number does not.
    const numeric = branches.some((b) => b.type === "integer" || b.type === "number");
    const shown = numeric ? branches.filter((b) => !(b.type === "string" && b.pattern !== undefined)) : branches;
    return orList([...new Set(shown.map(expected))]);
  }
  if ("const" in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.enum)) return orList(schema.enum.map((v) => JSON.stringify(v)));
  const { minimum, maximum } = schema as { minimum?: number; maximum?: number };
  const range =
    minimum !== undefined && maximum !== undefined
      ? ` from ${minimum} to ${maximum}`
      : minimum !== undefined
        ? ` of at least ${minimum}`
        : maximum !== undefined
          ? ` of at most ${maximum}`
          : "";
  switch (schema.type) {
    case "integer":
      return `an integer${range}`;
    case "number":
      return `a number${range}`;
    case "boolean":
      return "a boolean";
    case "array":
      return "an array";
    case "object": {
      const required = Array.isArray(schema.required) ? schema.required.map(String) : [];
      const properties = (schema.properties ?? {}) as Record<string, Schema>;
      // A field of a plain type is described too; an object's own fields are not (one level).
      const field = (key: string) => {
        const type = properties[key]?.type;
        return type === "integer" || type === "number" || type === "boolean"
          ? `${key} (${expected(properties[key]!)})`
          : key;
      };
      return required.length ? `an object with ${required.map(field).join(" and ")}` : "an object";
    }
    case "string":
      return schema.pattern === undefined ? "a string" : `a string matching ${String(schema.pattern)}`;
    default:
      return "a valid value";
  }
}

/** `a`, `a or b`, `a, b or c`. */
function orList(items: readonly string[]): string {
  return items.length < 2 ? (items[0] ?? "") : `${items.slice(0, -1).join(", ")} or ${items.at(-1)}`;
}

/**
 * A short, bounded rendering of a value for messages. Never an object's or an array's content:
 * what a message quotes is a scalar the caller sent, never a record (or a large input) echoed.
 */
function describe(value: unknown): string {
  if (value === undefined) return "undefined";
  if (Array.isArray(value)) return "an array";
  if (value !== null && typeof value === "object") return "an object";
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 64 ? `${text.slice(0, 61)}...` : text;
}

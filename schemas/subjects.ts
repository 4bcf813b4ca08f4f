// NATS subjects derived from operation contracts: request subjects filled from an input,
// subscription subjects with wildcards, and reading `{field}` values back from a subject.
import { nameFromToken, nameToken } from "./escape.ts";
import type { Operation } from "./types.ts";

/** `prefix` + subject; an empty prefix means none. A prefix must not end with `.`. */
export function withPrefix(prefix: string, subject: string): string {
  return prefix ? `${prefix}.${subject}` : subject;
}

/** The request subject of `op` for `input`; `{field}` tokens become base64url tokens. */
export function requestSubject(op: Operation, input: Record<string, unknown>, prefix = ""): string {
  const subject = op.subject.replace(/\{(\w+)\}/g, (_, field: string) =>
    nameToken(String(input[field])),
  );
  return withPrefix(prefix, subject);
}

/** The JSON request body of `op` for `input`: the input less the fields its subject carries. */
export function requestBody(op: Operation, input: Record<string, unknown>): string {
  const fields = subjectFields(op);
  if (fields.length === 0) return JSON.stringify(input);
  const body = { ...input };
  for (const field of fields) delete body[field];
  return JSON.stringify(body);
}

const fieldCache = new WeakMap<Operation, string[]>();
/** Names of the `{field}` tokens in an operation's subject. */
export function subjectFields(op: Operation): string[] {
  let fields = fieldCache.get(op);
  if (!fields) fieldCache.set(op, (fields = [...op.subject.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!)));
  return fields;
}

/** The subscription subject of `op`: `{field}` tokens become `*`. */
export function subscriptionSubject(op: Operation, prefix = ""): string {
  return withPrefix(prefix, op.subject.replace(/\{\w+\}/g, "*"));
}

/**
 * Reads the `{field}` values of `op` from a received subject. `undefined` when a token is
 * not canonical base64url (a direct caller built it by hand).
 */
export function subjectValues(
  op: Operation,
  subject: string,
  prefix = "",
): Record<string, string> | undefined {
  const pattern = withPrefix(prefix, op.subject).split(".");
  const tokens = subject.split(".");
  const values: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const field = /^\{(\w+)\}$/.exec(pattern[i]!)?.[1];
    if (field === undefined) continue;
    const value = nameFromToken(tokens[i] ?? "");
    if (value === undefined) return undefined;
    values[field] = value;
  }
  return values;
}

/** Reply header carrying the HTTP status of an error (NATS micro convention). */
export const ERROR_CODE_HEADER = "Nats-Service-Error-Code";
/** Reply header carrying the `_tag` of an error. */
export const ERROR_TAG_HEADER = "Nats-Service-Error";
/** Request header fixing the id of a created record, so a retried create is not a second one. */
export const IDEMPOTENCY_KEY_HEADER = "Idempotency-Key";
/** Request header carrying the caller's request id, so one request can be followed in logs. */
export const REQUEST_ID_HEADER = "X-Request-Id";

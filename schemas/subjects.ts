// NATS subjects derived from operation contracts: request subjects filled from an input,
// subscription subjects with wildcards, owners' own subjects, and reading `{field}` values back.
import { LRUCache } from "lru-cache";
import { nameFromToken, nameToken } from "./escape.ts";
import type { OwnedPlacement, Operation } from "./types.ts";

/** `prefix` + subject; an empty prefix means none. A prefix must not end with `.`. */
export function withPrefix(prefix: string, subject: string): string {
  return prefix ? `${prefix}.${subject}` : subject;
}

/** The request subject of `op` for `input`; `{field}` tokens become base64url tokens. */
export function requestSubject(op: Operation, input: Record<string, unknown>, prefix = ""): string {
  const { parts } = subjectPattern(op);
  let subject = parts[0]!;
  for (let i = 1; i < parts.length; i += 2) subject += nameToken(String(input[parts[i]!])) + parts[i + 1]!;
  return withPrefix(prefix, subject);
}

/** The JSON request body of `op` for `input`: the input less the fields its subject carries. */
export function requestBody(op: Operation, input: Record<string, unknown>): string {
  const { fields } = subjectPattern(op);
  if (fields.length === 0) return JSON.stringify(input);
  // A copy without them (not `delete`, which turns an object into a slow dictionary).
  const body: Record<string, unknown> = {};
  for (const key of Object.keys(input)) if (!fields.includes(key)) body[key] = input[key];
  return JSON.stringify(body);
}

/** Names of the `{field}` tokens in an operation's subject. */
export function subjectFields(op: Operation): string[] {
  return subjectPattern(op).fields;
}

interface SubjectPattern {
  /** `op.subject` cut at its `{field}` tokens: literal text and field names in turn, literal first and last. */
  readonly parts: string[];
  /** The field names, in order (the odd `parts`). */
  readonly fields: string[];
}

const patterns = new WeakMap<Operation, SubjectPattern>();
/** `op.subject` parsed once per operation object. */
function subjectPattern(op: Operation): SubjectPattern {
  let pattern = patterns.get(op);
  if (!pattern) {
    const parts = op.subject.split(/\{(\w+)\}/);
    pattern = { parts, fields: parts.filter((_, i) => i % 2 === 1) };
    patterns.set(op, pattern);
  }
  return pattern;
}

/** The subscription subject of `op`: `{field}` tokens become `*`. */
export function subscriptionSubject(op: Operation, prefix = ""): string {
  return withPrefix(prefix, op.subject.replace(/\{\w+\}/g, "*"));
}

/**
 * A copy of `op` whose subject has `tokens` after its first token (`taskobjects.{name}.get` →
 * `taskobjects.owner.<token>.{name}.get`).
 */
function insertTokens<Op extends Operation>(op: Op, tokens: string): Op {
  const dot = op.subject.indexOf(".");
  return { ...op, subject: `${op.subject.slice(0, dot)}.${tokens}${op.subject.slice(dot)}` };
}

/** The token that marks an owner's own subjects, per placement (`taskobjects.owner.…`, `microvms.host.…`). */
const OWNER_MARK: Record<OwnedPlacement["kind"], string> = { byName: "owner", byHost: "host" };

/**
 * The root of owner `ownerId`'s own subjects for operations under `root` placed `kind`:
 * `taskobjects.owner.<owner-token>`, `microvms.host.<host-token>` (below the prefix).
 */
export function ownerSubjectRoot(root: string, kind: OwnedPlacement["kind"], ownerId: string): string {
  return `${root}.${OWNER_MARK[kind]}.${nameToken(ownerId)}`;
}

/**
 * Every owner's own subjects of owned `op`, as a wildcard (`taskobjects.owner.>`,
 * `microvms.host.>`): what owners serve and forward on.
 */
export function ownerSubjects(op: Operation, prefix = ""): string {
  const placement = op.placement;
  if (placement.kind === "stateless") throw new TypeError(`${op.name} has no owner: it is stateless`);
  const root = op.subject.slice(0, op.subject.indexOf("."));
  return withPrefix(prefix, `${root}.${OWNER_MARK[placement.kind]}.>`);
}

/**
 * The copy of an owned `op` that process `ownerId` alone serves: its subject with the owner's
 * mark after the first token (`taskobjects.owner.<token>.{name}.get`, `microvms.host.<token>.token`).
 */
export function onOwner<Op extends Operation>(op: Op, ownerId: string): Op {
  const placement = op.placement;
  if (placement.kind === "stateless") throw new TypeError(`${op.name} has no owner: it is stateless`);
  return insertTokens(op, `${OWNER_MARK[placement.kind]}.${nameToken(ownerId)}`);
}

/**
 * The owner copies already made, per owner and operation. Bounded: every process start is a
 * new owner id, so over a long life a gateway sees owners without end.
 */
const ownerOps = new LRUCache<string, Operation>({ max: 4_096 });

/** The request subject of owned `op` for `input` on process `ownerId`'s own subjects. */
export function ownerSubject(op: Operation, ownerId: string, input: Record<string, unknown>, prefix = ""): string {
  const id = `${ownerId}\0${op.name}`;
  let opOnOwner = ownerOps.get(id);
  if (!opOnOwner) ownerOps.set(id, (opOnOwner = onOwner(op, ownerId)));
  return requestSubject(opOnOwner, input, prefix);
}

/** The first token of the gateway's copies of the operations' subjects. */
const GATEWAY_MARK = "gateway";

/**
 * The copy of an operation the gateway requests: `gateway.<subject>` (`gateway.tasks.get`,
 * `gateway.taskobjects.<name-token>.get`, `gateway.microvms.run`), which only the gateway's NATS
 * user may publish, so the principal header it carries can be believed. First, not after the
 * subject's first token: no operation's subject begins with it, so no subject a caller may
 * publish matches a copy (`taskobjects.gateway.list` would match `taskobjects.*.list`).
 */
export function viaGateway<Op extends Operation>(op: Op): Op {
  return { ...op, subject: `${GATEWAY_MARK}.${op.subject}` };
}

/**
 * Reads the `{field}` values of `op` from a received subject. `undefined` when a token is
 * not canonical base64url (a direct caller built it by hand).
 */
export function subjectValues(op: Operation, subject: string, prefix = ""): Record<string, string> | undefined {
  return subjectReader(op, prefix)(subject);
}

/** `subjectValues` of `op` with its pattern parsed once, for a subscription's every message. */
export function subjectReader(op: Operation, prefix = ""): (subject: string) => Record<string, string> | undefined {
  const fields: { index: number; field: string }[] = [];
  withPrefix(prefix, op.subject)
    .split(".")
    .forEach((token, index) => {
      const field = /^\{(\w+)\}$/.exec(token)?.[1];
      if (field !== undefined) fields.push({ index, field });
    });
  return (subject) => {
    const values: Record<string, string> = {};
    if (fields.length === 0) return values;
    const tokens = subject.split(".");
    for (const { index, field } of fields) {
      const value = nameFromToken(tokens[index] ?? "");
      if (value === undefined) return undefined;
      values[field] = value;
    }
    return values;
  };
}

/** Reply header carrying the HTTP status of an error (NATS micro convention). */
export const ERROR_CODE_HEADER = "Nats-Service-Error-Code";
/** Reply header carrying the `_tag` of an error. */
export const ERROR_TAG_HEADER = "Nats-Service-Error";
/** Request header fixing the id of a created record, so a retried create is not a second one. */
export const IDEMPOTENCY_KEY_HEADER = "Idempotency-Key";
/**
 * Request header (`1`): the `Idempotency-Key` was made by the sender for this request alone, not
 * chosen by a caller, and this is the request's first attempt. No write of that key can exist
 * yet, so a task-object create writes it without the server's check that the key is new. Every
 * later attempt of the request (a retry, a hedge, a forward after a timeout) goes without it,
 * and is checked.
 */
export const KEY_FRESH_HEADER = "Idempotency-Key-Fresh";
/** Request header carrying the caller's request id, so one request can be followed in logs. */
export const REQUEST_ID_HEADER = "X-Request-Id";
/** On a reply that is a stored record (or its deletion): the record's revision (HTTP: `ETag: "<revision>"`). */
export const REVISION_HEADER = "Revision";
/** On a reply that is a stored record (or its deletion): which one, as `<bucket>.<key>`. */
export const RECORD_HEADER = "Record";
/** On a write: the revision the record must still be at (HTTP `If-Match`), else 412 PreconditionFailed. */
export const IF_MATCH_HEADER = "If-Match";
/**
 * Request header naming the caller's principal, believed only on subjects its sender alone may
 * publish: the gateway's copies (`gateway.tasks.*`, `gateway.microvms.*`...), and owners' own
 * subjects (`taskobjects.owner.*`, `microvms.host.*`), which only actors, hosts and the gateway
 * publish. Named for the API that had it first; every API's gateway copies carry it.
 */
export const PRINCIPAL_HEADER = "Microvm-Principal";
/**
 * Request header naming the API key the caller sent (its id: no secret), beside the principal:
 * a proxy token asked for with it is refused once the key is revoked. It can only narrow what
 * a token opens, so it is taken wherever it comes.
 */
export const API_KEY_ID_HEADER = "Microvm-Api-Key-Id";

/** Root of the NATS micro control subjects; not below the operations' prefix: the protocol fixes it. */
export const SERVICE_API_PREFIX = "$SRV";

/**
 * The NATS micro services, one per role that serves operations; each process is an instance.
 * One service per connection: a `$SRV.PING` then reaches it once, and its one reply is what
 * `allow_responses` lets it send.
 */
export const serviceNames = { actors: "actors", microvms: "microvms" } as const;

/** The control subjects service `name` answers: `$SRV.<verb>`, `$SRV.<verb>.<name>`, `$SRV.<verb>.<name>.<id>`. */
export function serviceControlSubjects(name: string): string[] {
  return [`${SERVICE_API_PREFIX}.*`, `${SERVICE_API_PREFIX}.*.${name}`, `${SERVICE_API_PREFIX}.*.${name}.*`];
}

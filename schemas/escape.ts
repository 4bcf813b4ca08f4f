// Subject tokens and KV keys for arbitrary strings. Pure functions, tested on their own.

/** Longest KV key we ever write or look up; longer ids cannot exist in a bucket. */
export const MAX_KEY_LENGTH = 2048;

// A name comes again and again (every request of a task object carries it, every owner's subject
// its owner's id): the last ones coded are kept both ways, as a lookup costs a fifth of a coding.
const MEMO_ENTRIES = 1_024;
const MEMO_LENGTH = 128;
const tokens = new Map<string, string>();
const names = new Map<string, string | undefined>();

function memo<V>(kept: Map<string, V>, key: string, value: V): V {
  if (key.length > MEMO_LENGTH) return value;
  if (kept.size >= MEMO_ENTRIES) kept.clear();
  kept.set(key, value);
  return value;
}

/** Base64url without padding: any string becomes one safe subject token. */
export function nameToken(name: string): string {
  return tokens.get(name) ?? memo(tokens, name, Buffer.from(name, "utf8").toString("base64url"));
}

/** Inverse of `nameToken`; `undefined` when the token is not canonical base64url. */
export function nameFromToken(token: string): string | undefined {
  const known = names.get(token);
  if (known !== undefined || names.has(token)) return known;
  return memo(names, token, decodeToken(token));
}

function decodeToken(token: string): string | undefined {
  if (token.length === 0 || !/^[A-Za-z0-9_-]+$/.test(token)) return undefined;
  const name = Buffer.from(token, "base64url").toString("utf8");
  return nameToken(name) === token ? name : undefined;
}

const PLAIN_KEY = /^[A-Za-z0-9-]+$/;

/**
 * A KV key for an id. Ids of letters, digits and `-` (every uuid) are used as they are;
 * anything else becomes `_` + base64url, which no plain id can equal (plain ids have no `_`).
 * `undefined` when the key would be longer than `MAX_KEY_LENGTH`: no such record can exist.
 */
export function idKey(id: string): string | undefined {
  const key = PLAIN_KEY.test(id) ? id : `_${nameToken(id)}`;
  return key.length <= MAX_KEY_LENGTH ? key : undefined;
}

/**
 * The principal of every caller when API keys are off (NATS callers included), and the owner of
 * data written before records had owners: its keys carry no owner token.
 */
export const ANONYMOUS = "anonymous";

/** Marks a key's first token as an owner's: `=` is in no plain id, escaped id or base64url token. */
const OWNED_KEY_MARK = "=";

/**
 * The first key token of `principal`'s records: `=` + base64url of the principal; "" for the
 * anonymous principal, whose keys are laid out as before owners existed.
 */
export function ownerToken(principal: string): string {
  return principal === ANONYMOUS ? "" : `${OWNED_KEY_MARK}${nameToken(principal)}`;
}

/** What every key of `principal` starts with: `=<base64url>.`, or "" (anonymous). */
export function ownerPrefix(principal: string): string {
  const token = ownerToken(principal);
  return token && `${token}.`;
}

/**
 * `principal`'s key of a record whose key without owners is `key`; `undefined` when `key` is
 * (an id that has no key) or when the whole would be longer than `MAX_KEY_LENGTH`.
 */
export function ownedKey(principal: string, key: string | undefined): string | undefined {
  if (key === undefined) return undefined;
  const full = ownerPrefix(principal) + key;
  return full.length <= MAX_KEY_LENGTH ? full : undefined;
}

/** True for a key of a named principal's (it starts with an owner token), false for the anonymous principal's. */
export const hasOwnerToken = (key: string): boolean => key.startsWith(OWNED_KEY_MARK);

/**
 * Whose `key` is and the key without its owner: the inverse of `ownedKey`. `undefined` when it
 * starts with an owner token that is not canonical (no key this service writes).
 */
export function keyOwner(key: string): { principal: string; key: string } | undefined {
  if (!hasOwnerToken(key)) return { principal: ANONYMOUS, key };
  const dot = key.indexOf(".");
  const principal = dot < 0 ? undefined : nameFromToken(key.slice(OWNED_KEY_MARK.length, dot));
  if (principal === undefined || principal === ANONYMOUS) return undefined;
  return { principal, key: key.slice(dot + 1) };
}

/**
 * The key of task object `name` of `principal`: its lease's key (`<name-token>`, owned
 * `=<owner>.<name-token>`), which prefixes its records' keys and identifies it in placement.
 */
export function taskObjectLeaseKey(name: string, principal = ANONYMOUS): string | undefined {
  return ownedKey(principal, nameToken(name));
}

/** The name of the task object whose lease key is `key`; the key itself when it names none. */
export function taskObjectName(key: string): string {
  const rest = keyOwner(key)?.key;
  return (rest !== undefined && nameFromToken(rest)) || key;
}

/** The KV key of a task `id` inside the task object `name` of `principal`. */
export function taskObjectKey(name: string, id: string, principal = ANONYMOUS): string | undefined {
  const key = idKey(id);
  const object = taskObjectLeaseKey(name, principal);
  if (key === undefined || object === undefined) return undefined;
  const full = `${object}.${key}`;
  return full.length <= MAX_KEY_LENGTH ? full : undefined;
}

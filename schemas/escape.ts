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

/** The KV key of a task `id` inside the task object `name`. */
export function taskObjectKey(name: string, id: string): string | undefined {
  const key = idKey(id);
  if (key === undefined) return undefined;
  const full = `${nameToken(name)}.${key}`;
  return full.length <= MAX_KEY_LENGTH ? full : undefined;
}

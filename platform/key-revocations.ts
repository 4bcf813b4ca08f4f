// Revoked API keys, both sides: a gateway whose key file lost a key records its id, with when,
// in one KV record; microVM hosts read that record at start and again every second, and refuse
// the proxy tokens issued under a revoked key. Key ids are no secret (a hash of the file's line).
// An entry lasts as long as a token issued before it can (60 minutes, plus clock skew).
import { CONFLICT, versionedStore } from "./lease-store.ts";
import { log } from "./log.ts";
import type { Requester } from "./requester.ts";

/** The longest a proxy token lives (contract: expirationInMinutes 1..60). */
const TOKEN_LIFETIME_MS = 60 * 60_000;
/**
 * How far the clocks of a gateway and a host may differ: a token issued up to this long after
 * its key's revocation (by the host's clock) is refused too.
 */
export const REVOCATION_SKEW_MS = 60_000;
/** How long an entry is kept: past it, every token it could refuse has expired. */
export const REVOCATION_KEEP_MS = TOKEN_LIFETIME_MS + 2 * REVOCATION_SKEW_MS;
/** The bucket of the record (`bucketNames.keyRevocations`); its messages expire after `REVOCATION_KEEP_MS`. */
export const KEY_REVOCATIONS_BUCKET = "apikey-revocations";
/** The one key of the revocations bucket. */
const RECORD_KEY = "revoked";
const MAX_CONFLICTS = 20;

/** Revoked key ids and when each was revoked (epoch ms). */
export type RevokedKeys = ReadonlyMap<string, number>;

function parse(value: Uint8Array | undefined): Map<string, number> {
  if (!value || value.length === 0) return new Map();
  try {
    const entries = Object.entries(JSON.parse(Buffer.from(value).toString()) as Record<string, unknown>);
    return new Map(entries.filter((entry): entry is [string, number] => Number.isFinite(entry[1])));
  } catch {
    return new Map();
  }
}

/**
 * Adds `keyIds` as revoked at `now` to the record (dropping entries past their keep), with a
 * revision check and a bounded retry when another gateway wrote meanwhile.
 */
export async function recordRevocations(
  requester: Requester,
  keyIds: readonly string[],
  now = Date.now(),
): Promise<void> {
  const store = versionedStore(requester, KEY_REVOCATIONS_BUCKET);
  for (let attempt = 0; attempt < MAX_CONFLICTS; attempt++) {
    const entry = await store.get(RECORD_KEY);
    const revoked = parse(entry.value);
    for (const [id, at] of revoked) if (at + REVOCATION_KEEP_MS < now) revoked.delete(id);
    for (const id of keyIds) revoked.set(id, Math.max(now, revoked.get(id) ?? 0));
    const written = await store.put(RECORD_KEY, JSON.stringify(Object.fromEntries(revoked)), entry.revision);
    if (written !== CONFLICT) return;
  }
  throw new Error(`the revocations record kept changing (${MAX_CONFLICTS} conflicts)`);
}

/** A host's copy of the revocations record, read again every `everyMs`. */
export interface RevocationWatch {
  /** Whether a token issued at `issuedAt` under API key `keyId` is revoked. */
  revoked(keyId: string | undefined, issuedAt: number): boolean;
  /** Called with the record each time it is read and differs from the last one. */
  onChange(listener: (revoked: RevokedKeys) => void): void;
  close(): void;
}

/**
 * Reads the record once (rejects when it cannot: a host must not serve without it), then every
 * `everyMs`; a failed read keeps the copy it had and is logged once until one succeeds.
 */
export async function watchRevocations(requester: Requester, everyMs = 1_000): Promise<RevocationWatch> {
  const store = versionedStore(requester, KEY_REVOCATIONS_BUCKET);
  const first = await store.get(RECORD_KEY);
  let revision = first.revision;
  let current = parse(first.value);
  const listeners: ((revoked: RevokedKeys) => void)[] = [];
  let failing = false;
  const read = async () => {
    try {
      const entry = await store.get(RECORD_KEY);
      failing = false;
      if (entry.revision === revision) return;
      revision = entry.revision;
      current = parse(entry.value);
      for (const listener of listeners) listener(current);
    } catch (err) {
      if (!failing) log.warn({ err }, "API key revocations not read: the last copy stays in use");
      failing = true;
    }
  };
  let reading = false;
  const timer = setInterval(() => {
    if (reading) return;
    reading = true;
    void read().finally(() => (reading = false));
  }, everyMs);
  timer.unref();
  return {
    revoked(keyId, issuedAt) {
      if (keyId === undefined) return false;
      const at = current.get(keyId);
      return at !== undefined && issuedAt <= at + REVOCATION_SKEW_MS;
    },
    onChange: (listener) => void listeners.push(listener),
    close: () => clearInterval(timer),
  };
}

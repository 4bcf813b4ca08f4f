// HTTP API keys: a file of `<principal> <sha256 hex of key>` lines (`API_KEYS_FILE`), checked
// against `Authorization: Bearer <key>`. Only hashes are stored; keys are never logged.
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { ANONYMOUS, type ApiError, UNAUTHORIZED_MESSAGES, Unauthorized } from "../schemas/index.ts";
import { API_KEY_PRINCIPAL as PRINCIPAL, newApiKey, sha256Hex } from "../platform/index.ts";

export { newApiKey, sha256Hex };

const SHA256_HEX = /^[0-9a-f]{64}$/;
/** `Authorization: Bearer <key>`: the key. */
const BEARER = /^Bearer\s+(\S+)\s*$/i;

/** A key of the file: whose it is, and its id (no secret: a hash of its line, `apiKeyId`). */
export interface ApiKey {
  readonly principal: string;
  readonly keyId: string;
}

/** Known keys, by the sha256 of the key. */
export interface ApiKeys {
  /** The principal the request's bearer key stands for; undefined when none or unknown. */
  principalOf(req: IncomingMessage): string | undefined;
  /** The key the request's bearer key is; undefined when none or unknown. */
  keyOf(req: IncomingMessage): ApiKey | undefined;
  /** The ids of every key. */
  readonly keyIds: ReadonlySet<string>;
  /** How many distinct principals hold a key. */
  readonly principals: number;
}

/** The keys of a file that can be read again (SIGHUP): a request sees the old keys or the new. */
export interface ReloadableApiKeys extends ApiKeys {
  /**
   * Reads the file again; when it cannot be read or parsed, throws and keeps the keys it had.
   * Resolves with the ids of the keys it no longer holds (also told to `onRevoked`).
   */
  reload(): Promise<readonly string[]>;
  /** Called after each reload that removed keys, with their ids. */
  onRevoked(listener: (keyIds: readonly string[]) => void): void;
}

/**
 * The id of a key-file line: the same line always has the same id, and a key moved to another
 * principal gets another. Proxy tokens carry it readable, so it is a hash, not the key's hash.
 */
export const apiKeyId = (principal: string, hash: string) =>
  createHash("sha256").update(`api-key ${principal} ${hash}`).digest("base64url").slice(0, 16);

/** Parses the key file; throws naming the first bad line (never its hash). */
export function parseApiKeys(text: string): ApiKeys {
  const keys = new Map<string, ApiKey>();
  text.split("\n").forEach((raw, index) => {
    const line = raw.replace(/#.*/, "").trim();
    if (line === "") return;
    const [principal, hash, ...rest] = line.split(/\s+/);
    if (rest.length > 0 || !PRINCIPAL.test(principal!) || !SHA256_HEX.test(hash?.toLowerCase() ?? "")) {
      throw new Error(
        `API keys file, line ${index + 1}: expected "<principal> <sha256 hex of the key>" (principal: letters, ` +
          `digits, . _ @ -)`,
      );
    }
    const lowered = hash!.toLowerCase();
    keys.set(lowered, { principal: principal!, keyId: apiKeyId(principal!, lowered) });
  });
  const keyOf = (req: IncomingMessage) => {
    const header = req.headers.authorization;
    const match = header && BEARER.exec(header);
    // A lookup by hash: timing reveals nothing usable about the key itself.
    return match ? keys.get(sha256Hex(match[1]!)) : undefined;
  };
  return {
    principals: new Set([...keys.values()].map((key) => key.principal)).size,
    keyIds: new Set([...keys.values()].map((key) => key.keyId)),
    keyOf,
    principalOf: (req) => keyOf(req)?.principal,
  };
}

export async function loadApiKeys(path: string): Promise<ReloadableApiKeys> {
  let current = parseApiKeys(await readFile(path, "utf8"));
  // One read at a time, so a slow earlier read never replaces the keys of a later one.
  let reading: Promise<readonly string[]> = Promise.resolve([]);
  const listeners: ((keyIds: readonly string[]) => void)[] = [];
  return {
    get principals() {
      return current.principals;
    },
    get keyIds() {
      return current.keyIds;
    },
    principalOf: (req) => current.principalOf(req),
    keyOf: (req) => current.keyOf(req),
    reload() {
      reading = reading
        .catch(() => [])
        .then(async () => {
          const next = parseApiKeys(await readFile(path, "utf8"));
          const removed = [...current.keyIds].filter((id) => !next.keyIds.has(id));
          current = next;
          if (removed.length > 0) for (const listener of listeners) listener(removed);
          return removed;
        });
      return reading;
    },
    onRevoked: (listener) => void listeners.push(listener),
  };
}

/**
 * The 401 of a request whose key named no principal: no bearer key at all, or one that is not
 * valid (unknown, revoked). Neither says whether a principal exists (keys are found by hash).
 */
export function unauthorized(req: IncomingMessage): ApiError {
  const sent = BEARER.test(req.headers.authorization ?? "");
  return Unauthorized.make({ message: sent ? UNAUTHORIZED_MESSAGES.invalid : UNAUTHORIZED_MESSAGES.missing });
}

/** True for a loopback address (the microVM API may run without keys only there). */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\./.test(host);
}

// Kept on the request itself, like its id (request-id.ts).
const KEY_OF = Symbol("api key");
type Tagged = IncomingMessage & { [KEY_OF]?: ApiKey };

/** Records which key sent `req` (after the key check). */
export function setApiKey(req: IncomingMessage, key: ApiKey): void {
  (req as Tagged)[KEY_OF] = key;
}

/** Who sent `req`: its key's principal, or `anonymous` when API keys are off. */
export function principalOfRequest(req: IncomingMessage): string {
  return (req as Tagged)[KEY_OF]?.principal ?? ANONYMOUS;
}

/** The id of the key that sent `req`; undefined when API keys are off. */
export function apiKeyIdOfRequest(req: IncomingMessage): string | undefined {
  return (req as Tagged)[KEY_OF]?.keyId;
}

export { ANONYMOUS };

// HTTP API keys: a file of `<principal> <sha256 hex of key>` lines (`API_KEYS_FILE`), checked
// against `Authorization: Bearer <key>`. Only hashes are stored; keys are never logged.
import { createHash, randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { ANONYMOUS, type ApiError, UNAUTHORIZED_MESSAGES, Unauthorized } from "../schemas/index.ts";

/** Principal names: no `:`, so none can pass for a NATS principal (`nats:<user>`). */
const PRINCIPAL = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/;
const SHA256_HEX = /^[0-9a-f]{64}$/;
/** `Authorization: Bearer <key>`: the key. */
const BEARER = /^Bearer\s+(\S+)\s*$/i;

/** Known keys, by the sha256 of the key. */
export interface ApiKeys {
  /** The principal the request's bearer key stands for; undefined when none or unknown. */
  principalOf(req: IncomingMessage): string | undefined;
  /** How many distinct principals hold a key. */
  readonly principals: number;
}

/** The keys of a file that can be read again (SIGHUP): a request sees the old keys or the new. */
export interface ReloadableApiKeys extends ApiKeys {
  /** Reads the file again; when it cannot be read or parsed, throws and keeps the keys it had. */
  reload(): Promise<void>;
}

export const sha256Hex = (text: string) => createHash("sha256").update(text).digest("hex");

/** Parses the key file; throws naming the first bad line (never its hash). */
export function parseApiKeys(text: string): ApiKeys {
  const principals = new Map<string, string>();
  text.split("\n").forEach((raw, index) => {
    const line = raw.replace(/#.*/, "").trim();
    if (line === "") return;
    const [principal, hash, ...rest] = line.split(/\s+/);
    if (rest.length > 0 || !PRINCIPAL.test(principal!) || !SHA256_HEX.test(hash?.toLowerCase() ?? "")) {
      throw new Error(
        `API keys file, line ${index + 1}: expected "<principal> <sha256 hex of the key>" (principal: letters, digits, . _ @ -)`,
      );
    }
    principals.set(hash!.toLowerCase(), principal!);
  });
  return {
    principals: new Set(principals.values()).size,
    principalOf(req) {
      const header = req.headers.authorization;
      const match = header && BEARER.exec(header);
      // A lookup by hash: timing reveals nothing usable about the key itself.
      return match ? principals.get(sha256Hex(match[1]!)) : undefined;
    },
  };
}

export async function loadApiKeys(path: string): Promise<ReloadableApiKeys> {
  let current = parseApiKeys(await readFile(path, "utf8"));
  // One read at a time, so a slow earlier read never replaces the keys of a later one.
  let reading: Promise<void> = Promise.resolve();
  return {
    get principals() {
      return current.principals;
    },
    principalOf: (req) => current.principalOf(req),
    reload() {
      reading = reading
        .catch(() => undefined)
        .then(async () => {
          current = parseApiKeys(await readFile(path, "utf8"));
        });
      return reading;
    },
  };
}

/** A new random key for `principal` and the line that grants it (`taskctl apikey create`). */
export function newApiKey(principal: string): { key: string; line: string } {
  if (!PRINCIPAL.test(principal))
    throw new Error("a principal is 1-64 of letters, digits, . _ @ - (starting with a letter or digit)");
  const key = `tsk_${randomBytes(32).toString("base64url")}`;
  return { key, line: `${principal} ${sha256Hex(key)}` };
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
const PRINCIPAL_OF = Symbol("principal");
type Tagged = IncomingMessage & { [PRINCIPAL_OF]?: string };

/** Records who sent `req` (after the key check). */
export function setPrincipal(req: IncomingMessage, principal: string): void {
  (req as Tagged)[PRINCIPAL_OF] = principal;
}

/** Who sent `req`: its key's principal, or `anonymous` when API keys are off. */
export function principalOfRequest(req: IncomingMessage): string {
  return (req as Tagged)[PRINCIPAL_OF] ?? ANONYMOUS;
}

export { ANONYMOUS };

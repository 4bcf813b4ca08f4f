// `X-aws-proxy-auth` tokens: an HMAC-SHA256-signed claim binding an instance id, its allowed
// ports and an expiry. Format: base64url(JSON claims) "." base64url(mac). The claims name the
// signing key's id, so a key can be rotated while tokens signed with the previous one live on.
// Pure, no I/O.
import { createHash, createHmac, randomBytes, timingSafeEqual, type KeyObject } from "node:crypto";
import type { AllowedPort } from "../../schemas/index.ts";

/** What a token asserts. */
export interface TokenClaims {
  readonly v: 1;
  /** The instance the token opens. */
  readonly mid: string;
  readonly ports: readonly AllowedPort[];
  /** Issued and expiry times, epoch milliseconds. */
  readonly iat: number;
  readonly exp: number;
  /** Random id, so two tokens issued in the same millisecond differ. */
  readonly jti: string;
  /** Id of the signing key (`tokenKeyId`); absent in tokens from before key ids. */
  readonly kid?: string;
  /**
   * Id of the API key the token was asked for with (no secret: a hash of its key-file line);
   * the token is refused once that key is revoked. Absent without API keys, and over NATS.
   */
  readonly akid?: string;
}

export interface TokenRequest {
  readonly microvmId: string;
  /** 1..60 (contract). */
  readonly expirationInMinutes: number;
  readonly allowedPorts: readonly AllowedPort[];
  /** Issue time, epoch ms (default now). */
  readonly now?: number;
  /** The API key the token is asked for with (its claims' `akid`). */
  readonly apiKeyId?: string;
}

/** Why a token was refused. */
export type TokenRejection =
  | "missing"
  | "malformed"
  | "forged"
  | "expired"
  | "too-long-lived"
  | "issued-in-future"
  | "expiry-before-issue"
  | "wrong-instance"
  | "port-not-allowed"
  | "revoked";

export type TokenVerdict =
  | { readonly ok: true; readonly claims: TokenClaims }
  | { readonly ok: false; readonly reason: Exclude<TokenRejection, "port-not-allowed"> }
  /**
   * A valid token for other ports: its ports, to say which are open (they are no secret: the
   * token carries them readable).
   */
  | { readonly ok: false; readonly reason: "port-not-allowed"; readonly allowedPorts: readonly AllowedPort[] };

/** A signing secret: at least 32 bytes. */
export type SecretKey = string | Buffer | KeyObject;

/** Signs with `current`; verifies tokens of `current` and of the `previous` keys (rotation). */
export interface TokenKeyring {
  readonly current: SecretKey;
  readonly previous?: readonly SecretKey[];
}

/** Signing key: one secret, or a keyring while a key is being rotated. */
export type TokenKey = SecretKey | TokenKeyring;

/** The longest lifetime a token may claim (contract: expirationInMinutes 1..60). */
export const MAX_TOKEN_LIFETIME_MS = 60 * 60_000;

/** How far a token's `iat` may lie ahead of the verifier's clock (hosts' clocks differ a little). */
export const MAX_TOKEN_CLOCK_SKEW_MS = 60_000;

/** A token request outside the contract (expiry range, port shapes). */
export class InvalidTokenRequest extends Error {
  readonly _tag = "InvalidTokenRequest";
  constructor(message: string) {
    super(message);
    this.name = "InvalidTokenRequest";
  }
}

const MAX_TOKEN_LENGTH = 8192;
const BASE64URL = /^[A-Za-z0-9_-]+$/;
const MAC_BYTES = 32;
const MIN_KEY_BYTES = 32;

/** Signs a token for an instance; throws InvalidTokenRequest on out-of-contract input. */
export function createAuthToken(request: TokenRequest, key: TokenKey): { token: string; claims: TokenClaims } {
  const minutes = request.expirationInMinutes;
  if (!Number.isInteger(minutes) || minutes < 1 || minutes > 60) {
    throw new InvalidTokenRequest("expirationInMinutes must be an integer from 1 to 60");
  }
  if (request.allowedPorts.length === 0 || !request.allowedPorts.every(isAllowedPort)) {
    throw new InvalidTokenRequest("allowedPorts must be a non-empty list of {port} | {range} | {allPorts}");
  }
  const iat = request.now ?? Date.now();
  const signing = keysOf(key)[0]!;
  const claims: TokenClaims = {
    v: 1,
    mid: request.microvmId,
    ports: request.allowedPorts,
    iat,
    exp: iat + minutes * 60_000,
    jti: randomBytes(9).toString("base64url"),
    kid: tokenKeyId(signing),
    ...(request.apiKeyId === undefined ? {} : { akid: request.apiKeyId }),
  };
  const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
  return { token: `${payload}.${mac(payload, signing).toString("base64url")}`, claims };
}

/** Checks signature, expiry, instance and (when given) the port; timing-safe on the mac. */
export function verifyAuthToken(
  token: string | undefined,
  key: TokenKey,
  expect: { readonly microvmId: string; readonly port?: number; readonly now?: number },
): TokenVerdict {
  if (token === undefined || token === "") return { ok: false, reason: "missing" };
  if (token.length > MAX_TOKEN_LENGTH) return { ok: false, reason: "malformed" };
  const parts = token.split(".");
  const [payload, signature] = parts;
  if (parts.length !== 2 || !payload || !signature || !BASE64URL.test(payload) || !BASE64URL.test(signature)) {
    return { ok: false, reason: "malformed" };
  }
  // The claims choose the key to check against; nothing in them is believed before the mac is.
  const claims = decodeClaims(payload);
  if (!claims) return { ok: false, reason: "malformed" };
  const keys = keysOf(key);
  const signing = claims.kid === undefined ? keys[0] : keys.find((candidate) => tokenKeyId(candidate) === claims.kid);
  if (!signing) return { ok: false, reason: "forged" };
  const given = Buffer.from(signature, "base64url");
  const expected = mac(payload, signing);
  if (given.length !== MAC_BYTES || !timingSafeEqual(given, expected)) return { ok: false, reason: "forged" };
  // A well-signed token claiming more than the contract allows: a leaked key or a bug, never honoured.
  // Without the `iat` bound a token issued years ahead would pass the lifetime check.
  const now = expect.now ?? Date.now();
  if (claims.iat > now + MAX_TOKEN_CLOCK_SKEW_MS) return { ok: false, reason: "issued-in-future" };
  if (claims.exp <= claims.iat) return { ok: false, reason: "expiry-before-issue" };
  if (claims.exp - claims.iat > MAX_TOKEN_LIFETIME_MS) return { ok: false, reason: "too-long-lived" };
  if (claims.exp <= now) return { ok: false, reason: "expired" };
  if (claims.mid !== expect.microvmId) return { ok: false, reason: "wrong-instance" };
  if (expect.port !== undefined && !portAllowed(claims.ports, expect.port))
    return { ok: false, reason: "port-not-allowed", allowedPorts: claims.ports };
  return { ok: true, claims };
}

/** True when `port` falls in one of the allowed entries. */
export function portAllowed(allowed: readonly AllowedPort[], port: number): boolean {
  return allowed.some((entry) => {
    if ("allPorts" in entry) return true;
    if ("range" in entry) return port >= entry.range.startPort && port <= entry.range.endPort;
    return entry.port === port;
  });
}

/** True for a well-formed allowed-ports entry (ports 1..65535, start <= end). */
export function isAllowedPort(entry: unknown): entry is AllowedPort {
  if (typeof entry !== "object" || entry === null) return false;
  const candidate = entry as Record<string, unknown>;
  const keys = Object.keys(candidate);
  if (keys.length !== 1) return false;
  if (keys[0] === "port") return isPort(candidate.port);
  if (keys[0] === "allPorts") return isEmptyObject(candidate.allPorts);
  if (keys[0] !== "range" || typeof candidate.range !== "object" || candidate.range === null) return false;
  const { startPort, endPort } = candidate.range as Record<string, unknown>;
  return isPort(startPort) && isPort(endPort) && (startPort as number) <= (endPort as number);
}

/** The id tokens name a key by: the first 8 bytes of the sha256 of an HMAC under it (not the key). */
export function tokenKeyId(key: SecretKey): string {
  return createHash("sha256").update(mac("token-key-id", key)).digest("base64url").slice(0, 11);
}

/** The signing key first, then the ones still accepted. */
function keysOf(key: TokenKey): readonly SecretKey[] {
  if (typeof key === "object" && !Buffer.isBuffer(key) && "current" in key)
    return [key.current, ...(key.previous ?? [])];
  return [key as SecretKey];
}

function mac(payload: string, key: SecretKey): Buffer {
  const size =
    typeof key === "string" ? Buffer.byteLength(key) : Buffer.isBuffer(key) ? key.length : key.symmetricKeySize;
  if (size === undefined || size < MIN_KEY_BYTES)
    throw new TypeError(`token key must be at least ${MIN_KEY_BYTES} bytes`);
  return createHmac("sha256", key).update(payload).digest();
}

function decodeClaims(payload: string): TokenClaims | undefined {
  try {
    const claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as Partial<TokenClaims>;
    const wellFormed =
      claims.v === 1 &&
      typeof claims.mid === "string" &&
      Number.isFinite(claims.exp) &&
      Number.isFinite(claims.iat) &&
      (claims.kid === undefined || typeof claims.kid === "string") &&
      (claims.akid === undefined || typeof claims.akid === "string") &&
      Array.isArray(claims.ports) &&
      claims.ports.every(isAllowedPort);
    return wellFormed ? (claims as TokenClaims) : undefined;
  } catch {
    return undefined;
  }
}

function isPort(value: unknown): value is number {
  return Number.isInteger(value) && (value as number) >= 1 && (value as number) <= 65_535;
}

function isEmptyObject(value: unknown): boolean {
  return typeof value === "object" && value !== null && !Array.isArray(value) && Object.keys(value).length === 0;
}

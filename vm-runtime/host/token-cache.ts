// A proxy's memory of tokens it has verified: the HMAC is checked once per token string, then
// its claims are reused until they expire. Expiry, revocation and port are still checked on
// every request.
import { portAllowed, verifyAuthToken, type TokenClaims, type TokenKey, type TokenVerdict } from "../wire/token.ts";

export interface TokenVerifier {
  /** Same verdicts as `verifyAuthToken` for this instance. */
  verify(token: string | undefined, port: number | undefined, now: number): TokenVerdict;
}

/** Whether a token's API key was revoked since it was issued (`RevocationWatch.revoked`). */
export type RevokedCheck = (claims: TokenClaims) => boolean;

/** Verifies tokens for one instance, remembering up to `capacity` valid ones (oldest out first). */
export function createTokenVerifier(
  key: TokenKey,
  microvmId: string,
  options: { capacity?: number; revoked?: RevokedCheck } = {},
): TokenVerifier {
  const verified = new Map<string, TokenClaims>();
  const capacity = options.capacity ?? 64;
  return {
    verify(token, port, now) {
      const claims = token === undefined ? undefined : verified.get(token);
      if (!claims) {
        const verdict = verifyAuthToken(token, key, { microvmId, now, ...(port === undefined ? {} : { port }) });
        if (verdict.ok && options.revoked?.(verdict.claims)) return { ok: false, reason: "revoked" };
        // Only tokens that passed in full are kept: a forged or foreign one never enters the map.
        if (verdict.ok && token !== undefined) remember(verified, token, verdict.claims, capacity);
        return verdict;
      }
      if (options.revoked?.(claims)) {
        verified.delete(token!);
        return { ok: false, reason: "revoked" };
      }
      if (claims.exp <= now) {
        verified.delete(token!);
        return { ok: false, reason: "expired" };
      }
      if (port !== undefined && !portAllowed(claims.ports, port))
        return { ok: false, reason: "port-not-allowed", allowedPorts: claims.ports };
      return { ok: true, claims };
    },
  };
}

function remember(verified: Map<string, TokenClaims>, token: string, claims: TokenClaims, capacity: number): void {
  if (verified.size >= capacity) verified.delete(verified.keys().next().value as string);
  verified.set(token, claims);
}

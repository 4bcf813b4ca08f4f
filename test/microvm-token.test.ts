// Tests of the X-aws-proxy-auth tokens: signing, verification and every refusal reason.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import {
  createAuthToken,
  InvalidTokenRequest,
  MAX_TOKEN_CLOCK_SKEW_MS,
  MAX_TOKEN_LIFETIME_MS,
  tokenKeyId,
  verifyAuthToken,
} from "../vm-runtime/wire/token.ts";
import type { AllowedPort } from "../schemas/index.ts";
import { createTokenVerifier } from "../vm-runtime/host/token-cache.ts";

const key = "k".repeat(32);
const otherKey = "o".repeat(32);

function sign(
  allowedPorts: AllowedPort[] = [{ port: 8080 }],
  extra: { now?: number; minutes?: number; id?: string } = {},
) {
  return createAuthToken(
    {
      microvmId: extra.id ?? "vm-1",
      expirationInMinutes: extra.minutes ?? 5,
      allowedPorts,
      ...(extra.now === undefined ? {} : { now: extra.now }),
    },
    key,
  ).token;
}

test("token - a signed token verifies for its instance and port", () => {
  const verdict = verifyAuthToken(sign(), key, { microvmId: "vm-1", port: 8080 });
  assert.equal(verdict.ok, true);
  assert.equal(verdict.ok && verdict.claims.mid, "vm-1");
});

test("token - the format is base64url payload dot base64url mac", () => {
  assert.match(sign(), /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
});

test("token - a missing or empty token is refused as missing", () => {
  assert.deepEqual(verifyAuthToken(undefined, key, { microvmId: "vm-1" }), { ok: false, reason: "missing" });
  assert.deepEqual(verifyAuthToken("", key, { microvmId: "vm-1" }), { ok: false, reason: "missing" });
});

test("token - garbage is refused as malformed", () => {
  for (const garbage of ["abc", "a.b.c", "!!!.???", ".", "x".repeat(10_000), "a. b"]) {
    assert.deepEqual(
      verifyAuthToken(garbage, key, { microvmId: "vm-1" }),
      { ok: false, reason: "malformed" },
      garbage.slice(0, 20),
    );
  }
});

test("token - a token signed with another key is refused as forged", () => {
  const forged = createAuthToken(
    { microvmId: "vm-1", expirationInMinutes: 5, allowedPorts: [{ port: 8080 }] },
    otherKey,
  ).token;
  assert.deepEqual(verifyAuthToken(forged, key, { microvmId: "vm-1" }), { ok: false, reason: "forged" });
});

test("token - a tampered payload is refused as forged", () => {
  const [payload, mac] = sign().split(".") as [string, string];
  const claims = JSON.parse(Buffer.from(payload, "base64url").toString()) as Record<string, unknown>;
  const widened = Buffer.from(JSON.stringify({ ...claims, ports: [{ allPorts: {} }] })).toString("base64url");
  assert.deepEqual(verifyAuthToken(`${widened}.${mac}`, key, { microvmId: "vm-1", port: 22 }), {
    ok: false,
    reason: "forged",
  });
});

test("token - a truncated mac is refused as forged", () => {
  const token = sign();
  assert.deepEqual(verifyAuthToken(token.slice(0, -4), key, { microvmId: "vm-1" }), { ok: false, reason: "forged" });
});

test("token - an expired token is refused as expired", () => {
  const token = sign([{ port: 8080 }], { now: Date.now() - 61_000, minutes: 1 });
  assert.deepEqual(verifyAuthToken(token, key, { microvmId: "vm-1" }), { ok: false, reason: "expired" });
});

test("token - expiry is exact to the millisecond", () => {
  const now = 1_700_000_000_000;
  const token = sign([{ port: 8080 }], { now, minutes: 1 });
  assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", now: now + 59_999 }).ok, true);
  assert.deepEqual(verifyAuthToken(token, key, { microvmId: "vm-1", now: now + 60_000 }), {
    ok: false,
    reason: "expired",
  });
});

test("token - a token for another instance is refused", () => {
  assert.deepEqual(verifyAuthToken(sign(), key, { microvmId: "vm-2" }), { ok: false, reason: "wrong-instance" });
});

test("token - a single port allows only that port", () => {
  const token = sign([{ port: 3000 }]);
  assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", port: 3000 }).ok, true);
  assert.deepEqual(verifyAuthToken(token, key, { microvmId: "vm-1", port: 8080 }), {
    ok: false,
    reason: "port-not-allowed",
    allowedPorts: [{ port: 3000 }],
  });
});

test("token - a range allows its bounds and nothing outside", () => {
  const token = sign([{ range: { startPort: 3000, endPort: 3010 } }]);
  for (const port of [3000, 3005, 3010])
    assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", port }).ok, true);
  for (const port of [2999, 3011, 8080]) {
    assert.deepEqual(verifyAuthToken(token, key, { microvmId: "vm-1", port }), {
      ok: false,
      reason: "port-not-allowed",
      allowedPorts: [{ range: { startPort: 3000, endPort: 3010 } }],
    });
  }
});

test("token - allPorts allows every port", () => {
  const token = sign([{ allPorts: {} }]);
  for (const port of [1, 8080, 65_535]) assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", port }).ok, true);
});

test("token - several entries combine", () => {
  const token = sign([{ port: 8080 }, { range: { startPort: 9000, endPort: 9001 } }]);
  assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", port: 9001 }).ok, true);
  assert.equal(verifyAuthToken(token, key, { microvmId: "vm-1", port: 9002 }).ok, false);
});

test("token - expiration outside 1..60 minutes is rejected at creation", () => {
  for (const minutes of [0, 61, 1.5, -1, Number.NaN]) {
    assert.throws(() => sign([{ port: 8080 }], { minutes }), InvalidTokenRequest, String(minutes));
  }
  assert.doesNotThrow(() => sign([{ port: 8080 }], { minutes: 60 }));
});

test("token - malformed allowed ports are rejected at creation", () => {
  const bad = [
    [],
    [{ port: 0 }],
    [{ port: 70_000 }],
    [{ range: { startPort: 10, endPort: 5 } }],
    [{ allPorts: { x: 1 } }],
    [{ port: 80, allPorts: {} }],
  ];
  for (const allowedPorts of bad)
    assert.throws(() => sign(allowedPorts as AllowedPort[]), InvalidTokenRequest, JSON.stringify(allowedPorts));
});

test("token - a key shorter than 32 bytes is refused", () => {
  assert.throws(
    () => createAuthToken({ microvmId: "vm-1", expirationInMinutes: 1, allowedPorts: [{ port: 1 }] }, "short"),
    TypeError,
  );
});

test("token - two tokens issued at once differ", () => {
  const now = Date.now();
  assert.notEqual(sign([{ port: 8080 }], { now }), sign([{ port: 8080 }], { now }));
});

test("token cache - a remembered token still expires and is still checked per port", () => {
  const issued = Date.now();
  const token = sign([{ port: 8080 }], { now: issued, minutes: 1 });
  const verifier = createTokenVerifier(key, "vm-1");
  assert.equal(verifier.verify(token, 8080, issued + 1).ok, true);
  assert.equal(verifier.verify(token, 8080, issued + 2).ok, true, "answered from the cache");
  assert.deepEqual(verifier.verify(token, 9000, issued + 3), {
    ok: false,
    reason: "port-not-allowed",
    allowedPorts: [{ port: 8080 }],
  });
  assert.deepEqual(verifier.verify(token, 8080, issued + 60_000), { ok: false, reason: "expired" });
});

test("token cache - refused tokens are refused every time and are not remembered", () => {
  const verifier = createTokenVerifier(key, "vm-1", { capacity: 2 });
  const forged = createAuthToken(
    { microvmId: "vm-1", expirationInMinutes: 5, allowedPorts: [{ port: 8080 }] },
    otherKey,
  ).token;
  const foreign = sign([{ port: 8080 }], { id: "vm-2" });
  for (let i = 0; i < 2; i++) {
    assert.deepEqual(verifier.verify(forged, 8080, Date.now()), { ok: false, reason: "forged" });
    assert.deepEqual(verifier.verify(foreign, 8080, Date.now()), { ok: false, reason: "wrong-instance" });
  }
  const tokens = [sign(), sign(), sign()];
  for (const token of tokens) assert.equal(verifier.verify(token, 8080, Date.now()).ok, true);
  for (const token of tokens)
    assert.equal(verifier.verify(token, 8080, Date.now()).ok, true, "evicted ones verify again");
});

test("token cache - a token whose API key is revoked is refused, also once remembered", () => {
  const issue = (apiKeyId: string) =>
    createAuthToken({ microvmId: "vm-1", expirationInMinutes: 5, allowedPorts: [{ port: 8080 }], apiKeyId }, key).token;
  const revokedKeys = new Set<string>();
  const verifier = createTokenVerifier(key, "vm-1", { revoked: (claims) => revokedKeys.has(claims.akid ?? "") });
  const [gone, kept] = [issue("key-gone"), issue("key-kept")];
  assert.equal(verifier.verify(gone, 8080, Date.now()).ok, true, "before the revocation (and now remembered)");
  revokedKeys.add("key-gone");
  assert.deepEqual(verifier.verify(gone, 8080, Date.now()), { ok: false, reason: "revoked" });
  assert.deepEqual(verifier.verify(issue("key-gone"), 8080, Date.now()), { ok: false, reason: "revoked" });
  assert.equal(verifier.verify(kept, 8080, Date.now()).ok, true, "another key's token");
});

/** A token signed with `key` whose claims say whatever `claims` says (what a leaked key could mint). */
function signedClaims(claims: Record<string, unknown>): string {
  const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
  return `${payload}.${createHmac("sha256", key).update(payload).digest("base64url")}`;
}
const claimsAt = (iat: number, exp: number) => ({
  v: 1,
  mid: "vm-1",
  ports: [{ port: 8080 }],
  iat,
  exp,
  jti: "x",
  kid: tokenKeyId(key),
});

test("token - an iat beyond the clock skew is refused as issued-in-future", () => {
  const now = Date.now();
  const edge = now + MAX_TOKEN_CLOCK_SKEW_MS;
  assert.equal(MAX_TOKEN_CLOCK_SKEW_MS, 60_000);
  assert.equal(verifyAuthToken(signedClaims(claimsAt(edge, edge + 60_000)), key, { microvmId: "vm-1", now }).ok, true);
  assert.deepEqual(verifyAuthToken(signedClaims(claimsAt(edge + 1, edge + 60_000)), key, { microvmId: "vm-1", now }), {
    ok: false,
    reason: "issued-in-future",
  });
  const years = now + 3 * 365 * 24 * 3_600_000;
  assert.deepEqual(verifyAuthToken(signedClaims(claimsAt(years, years + 60_000)), key, { microvmId: "vm-1", now }), {
    ok: false,
    reason: "issued-in-future",
  });
});

test("token - an exp not after iat is refused as expiry-before-issue", () => {
  const now = Date.now();
  for (const exp of [now, now - 1, now - 3_600_000])
    assert.deepEqual(verifyAuthToken(signedClaims(claimsAt(now, exp)), key, { microvmId: "vm-1", now: now - 10 }), {
      ok: false,
      reason: "expiry-before-issue",
    });
});

test("token - a lifetime over 60 minutes is refused as too-long-lived", () => {
  const now = Date.now();
  const valid = (exp: number) => verifyAuthToken(signedClaims(claimsAt(now, exp)), key, { microvmId: "vm-1", now });
  assert.equal(valid(now + MAX_TOKEN_LIFETIME_MS).ok, true);
  assert.deepEqual(valid(now + MAX_TOKEN_LIFETIME_MS + 1), { ok: false, reason: "too-long-lived" });
});

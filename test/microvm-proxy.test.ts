// Tests of the instance proxy in front of real instance processes: every 403, port choice
// and mapping, 502s, header stripping, streaming, activity counting and auto-resume.
import { after, before, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { createHmac, randomBytes } from "node:crypto";
import { createServer } from "node:http";
import { connect, type AddressInfo } from "node:net";
import {
  builtinImages,
  createAuthToken,
  createInstanceProxy,
  createProcessProvider,
  upstreamOf,
  tokenKeyId,
  type InstanceProxyOptions,
  type MicrovmHandle,
} from "../vm-runtime/service/index.ts";
import { childProcessesWith } from "../vm-runtime/host/proc.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";
import type { AllowedPort, MicrovmState } from "../schemas/index.ts";

const key = randomBytes(32);
const provider = createProcessProvider();
let sandbox: MicrovmHandle;

before(async () => {
  sandbox = await provider.start({ microvmId: "vm-proxy", image: builtinImages.sandbox });
});

after(async () => {
  await provider.close();
  assert.deepEqual(childProcessesWith(process.pid, INSTANCE_MARKER), [], "an instance process was left running");
});

function token(allowedPorts: AllowedPort[] = [{ port: 8080 }], microvmId = "vm-proxy", now?: number): string {
  return createAuthToken(
    { microvmId, expirationInMinutes: 1, allowedPorts, ...(now === undefined ? {} : { now }) },
    key,
  ).token;
}

async function startProxy(t: TestContext, overrides: Partial<InstanceProxyOptions> & { handle?: MicrovmHandle } = {}) {
  const handle = overrides.handle ?? sandbox;
  const proxy = createInstanceProxy({
    microvmId: handle.microvmId,
    tokenKey: key,
    state: () => "RUNNING",
    resolveUpstream: (port) => upstreamOf(handle, port),
    upstreamHeaders: () => handle.upstreamHeaders,
    ...overrides,
  });
  const endpoint = await proxy.listen();
  t.after(() => proxy.close());
  return { proxy, base: `http://${endpoint}` };
}

function headers(auth?: string, port?: string): Record<string, string> {
  return {
    ...(auth === undefined ? {} : { "X-aws-proxy-auth": auth }),
    ...(port === undefined ? {} : { "X-aws-proxy-port": port }),
  };
}

async function hello(base: string, auth?: string, port?: string) {
  const response = await fetch(`${base}/__rpc__/hello`, {
    method: "POST",
    body: '["proxy"]',
    headers: headers(auth, port),
  });
  return { status: response.status, body: (await response.json()) as any };
}

test("proxy - forwards an authorised RPC call to the runtime on port 8080 by default", async (t) => {
  const { base } = await startProxy(t);
  assert.deepEqual(await hello(base, token()), { status: 200, body: "hello, proxy!" });
  assert.deepEqual(await hello(base, token(), "8080"), { status: 200, body: "hello, proxy!" });
});

test("proxy - a missing token is 403 naming the header to send", async (t) => {
  const { base } = await startProxy(t);
  const answer = await hello(base);
  assert.deepEqual([answer.status, answer.body._tag, answer.body.reason], [403, "MicrovmProxyForbidden", "missing"]);
  assert.match(
    answer.body.message,
    /^request refused: missing: no X-aws-proxy-auth header: send the one CreateAuthToken/,
  );
});

test("proxy - every 403 names the header or the port that is wrong", async (t) => {
  const { base } = await startProxy(t);
  const now = Date.now();
  const claims = { v: 1, mid: "vm-proxy", ports: [{ port: 8080 }], iat: now, jti: "x", kid: tokenKeyId(key) };
  const cases: [string, ReturnType<typeof hello>, RegExp][] = [
    ["malformed", hello(base, "not-a-token"), /X-aws-proxy-auth header is not a token/],
    ["forged", hello(base, signedClaims({ ...claims, exp: now + 60_000 }, randomBytes(32))), /X-aws-proxy-auth token/],
    ["expired", hello(base, token([{ port: 8080 }], "vm-proxy", now - 61_000)), /X-aws-proxy-auth token has expired/],
    ["too-long-lived", hello(base, signedClaims({ ...claims, exp: now + 61 * 60_000 })), /X-aws-proxy-auth token/],
    ["wrong-instance", hello(base, token([{ port: 8080 }], "vm-other")), /X-aws-proxy-auth token is for another/],
    ["port-not-allowed", hello(base, token([{ port: 3000 }])), /port 8080, .* X-aws-proxy-auth token's allowed ports/],
  ];
  for (const [reason, answered, names] of cases) {
    const { status, body } = await answered;
    assert.deepEqual([status, body.reason], [403, reason]);
    assert.match(body.message, new RegExp(`^request refused: ${reason}: `), reason);
    assert.match(body.message, names, reason);
  }
});

test("proxy - a forged token is 403 and the answer does not echo it", async (t) => {
  const { base } = await startProxy(t);
  const forged = createAuthToken(
    { microvmId: "vm-proxy", expirationInMinutes: 1, allowedPorts: [{ allPorts: {} }] },
    randomBytes(32),
  ).token;
  const answer = await hello(base, forged);
  assert.equal(answer.status, 403);
  assert.equal(answer.body.reason, "forged");
  assert.ok(!JSON.stringify(answer.body).includes(forged.slice(0, 20)));
  assert.equal((await hello(base, "not-a-token")).body.reason, "malformed");
});

test("proxy - an expired token is 403", async (t) => {
  const { base } = await startProxy(t);
  const answer = await hello(base, token([{ port: 8080 }], "vm-proxy", Date.now() - 61_000));
  assert.equal(answer.status, 403);
  assert.equal(answer.body.reason, "expired");
});

/** A token signed with `signingKey` whose claims say whatever `claims` says (what a leaked key could mint). */
function signedClaims(claims: Record<string, unknown>, signingKey: Buffer = key): string {
  const payload = Buffer.from(JSON.stringify(claims)).toString("base64url");
  return `${payload}.${createHmac("sha256", signingKey).update(payload).digest("base64url")}`;
}

test("proxy - a well-signed token living over 60 minutes is 403", async (t) => {
  const { base } = await startProxy(t);
  const now = Date.now();
  const claims = { v: 1, mid: "vm-proxy", ports: [{ port: 8080 }], iat: now, jti: "x", kid: tokenKeyId(key) };
  assert.equal(
    (await hello(base, signedClaims({ ...claims, exp: now + 60 * 60_000 }))).status,
    200,
    "60 minutes is the contract's limit",
  );
  const answer = await hello(base, signedClaims({ ...claims, exp: now + 61 * 60_000 }));
  assert.equal(answer.status, 403);
  assert.equal(answer.body.reason, "too-long-lived");
});

test("proxy - after a key rotation tokens of the previous key still open, others do not", async (t) => {
  const next = randomBytes(32);
  const { base } = await startProxy(t, { tokenKey: { current: next, previous: [key] } });
  assert.equal((await hello(base, token())).status, 200, "signed with the previous key");
  const fresh = createAuthToken(
    { microvmId: "vm-proxy", expirationInMinutes: 1, allowedPorts: [{ port: 8080 }] },
    { current: next, previous: [key] },
  ).token;
  assert.equal((await hello(base, fresh)).status, 200, "signed with the current key");
  const retired = createAuthToken(
    { microvmId: "vm-proxy", expirationInMinutes: 1, allowedPorts: [{ port: 8080 }] },
    randomBytes(32),
  ).token;
  assert.equal((await hello(base, retired)).body.reason, "forged");
});

test("proxy - a token for another instance is 403", async (t) => {
  const { base } = await startProxy(t);
  const answer = await hello(base, token([{ port: 8080 }], "vm-other"));
  assert.equal(answer.status, 403);
  assert.equal(answer.body.reason, "wrong-instance");
});

test("proxy - a port outside the token's ports is 403", async (t) => {
  const { base } = await startProxy(t);
  assert.equal(
    (await hello(base, token([{ port: 3000 }]))).body.reason,
    "port-not-allowed",
    "default port 8080 not in token",
  );
  const ranged = token([{ range: { startPort: 3000, endPort: 3009 } }]);
  assert.equal((await hello(base, ranged, "3010")).status, 403);
  assert.equal((await hello(base, ranged, "8080")).status, 403);
});

test("proxy - a port outside the token's is 403 naming that port and the token's ports", async (t) => {
  const { base } = await startProxy(t);
  const ports = [{ port: 3000 }, { range: { startPort: 9000, endPort: 9001 } }];
  const asked = await hello(base, token(ports), "9002");
  assert.equal(asked.status, 403);
  assert.deepEqual(
    [asked.body._tag, asked.body.reason, asked.body.port, asked.body.allowedPorts],
    ["MicrovmProxyForbidden", "port-not-allowed", 9002, ports],
  );
  assert.equal(
    asked.body.message,
    "request refused: port-not-allowed: port 9002, which X-aws-proxy-port asks for, is not among the " +
      "X-aws-proxy-auth token's allowed ports (3000, 9000-9001): send X-aws-proxy-port with one of those, " +
      "or ask CreateAuthToken for a token that opens port 9002",
  );
  const byDefault = await hello(base, token(ports));
  assert.equal(byDefault.body.port, 8080);
  assert.match(
    byDefault.body.message,
    /^request refused: port-not-allowed: port 8080, which the request asks for \(no X-aws-proxy-port: 8080\)/,
  );
});

test("proxy - an invalid X-aws-proxy-port is 400 once the token is valid", async (t) => {
  const { base } = await startProxy(t);
  for (const port of ["abc", "0", "70000", "-1", "80 80", "8080.5"]) {
    const answer = await hello(base, token([{ allPorts: {} }]), port);
    assert.equal(answer.status, 400, port);
    assert.equal(answer.body._tag, "InvalidProxyPort");
  }
  assert.equal((await hello(base, undefined, "abc")).status, 403, "no token: 403 first");
});

test("proxy - maps a virtual port to the app's real local port", async (t) => {
  const app = createServer((req, res) => res.end(`app saw ${req.url}`));
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise((resolve) => app.close(resolve)));
  const appPort = (app.address() as AddressInfo).port;
  const { base } = await startProxy(t, {
    resolveUpstream: (port) => (port === 3000 ? { host: "127.0.0.1", port: appPort } : upstreamOf(sandbox, port)),
  });
  const auth = token([{ range: { startPort: 3000, endPort: 3001 } }, { port: 8080 }]);
  const viaApp = await fetch(`${base}/x?y=1`, { headers: headers(auth, "3000") });
  assert.equal(await viaApp.text(), "app saw /x?y=1");
  const viaRuntime = await fetch(`${base}/echo?message=rt`, { headers: headers(auth) });
  assert.equal(await viaRuntime.text(), "rt");
});

/** An app on a free port whose handler the test supplies; the proxy maps virtual port 3000 to it. */
async function proxiedApp(t: TestContext, handler: Parameters<typeof createServer>[1]) {
  const app = createServer(handler);
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise((resolve) => app.close(resolve)));
  const appPort = (app.address() as AddressInfo).port;
  const { base } = await startProxy(t, {
    resolveUpstream: (port) => (port === 3000 ? { host: "127.0.0.1", port: appPort } : undefined),
  });
  return { base, auth: headers(token([{ port: 3000 }]), "3000") };
}

test("proxy - a caller that goes away mid-answer closes the app's connection", async (t) => {
  let appSawClose!: () => void;
  const closed = new Promise<void>((resolve) => (appSawClose = resolve));
  const { base, auth } = await proxiedApp(t, (_req, res) => {
    res.writeHead(200).write("partial");
    res.on("close", () => appSawClose());
  });
  const caller = new AbortController();
  const response = await fetch(`${base}/slow`, { headers: auth, signal: caller.signal });
  assert.equal(response.status, 200);
  caller.abort();
  await closed;
});

// A cut that never comes would leave the read waiting: the test's timeout fails it.
test("proxy - a revoked key's token is 403 revoked, and its answers under way are cut; another key's go on", {
  timeout: 10_000,
}, async (t) => {
  const app = createServer((_req, res) => res.writeHead(200).write("streaming"));
  await new Promise<void>((resolve) => app.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    app.closeAllConnections();
    return new Promise((resolve) => app.close(resolve));
  });
  const appPort = (app.address() as AddressInfo).port;
  const revokedKeys = new Set<string>();
  const { proxy, base } = await startProxy(t, {
    resolveUpstream: () => ({ host: "127.0.0.1", port: appPort }),
    revoked: (claims) => revokedKeys.has(claims.akid ?? ""),
  });
  const tokenOf = (apiKeyId: string) =>
    createAuthToken({ microvmId: "vm-proxy", expirationInMinutes: 1, allowedPorts: [{ port: 8080 }], apiKeyId }, key)
      .token;
  const [gone, kept] = [tokenOf("key-gone"), tokenOf("key-kept")];
  const streams = await Promise.all([gone, kept].map((auth) => fetch(`${base}/`, { headers: headers(auth) })));
  const readers = streams.map((res) => res.body!.getReader());
  for (const reader of readers) assert.ok((await reader.read()).value, "a first chunk");
  revokedKeys.add("key-gone");
  assert.equal(proxy.endRevoked(), 1);
  await assert.rejects(readers[0]!.read(), "the revoked key's answer is cut");
  const refused = await fetch(`${base}/`, { headers: headers(gone) });
  assert.equal(refused.status, 403);
  assert.equal(((await refused.json()) as { reason: string }).reason, "revoked");
  assert.equal(proxy.inFlight, 1, "the other key's answer goes on");
  await readers[1]!.cancel();
});

test("proxy - an app that breaks off mid-answer breaks off the caller's answer", async (t) => {
  const { base, auth } = await proxiedApp(t, (_req, res) => {
    res.writeHead(200, { "content-length": "100" }).write("short");
    setTimeout(() => res.destroy(), 20);
  });
  const response = await fetch(`${base}/cut`, { headers: auth });
  assert.equal(response.status, 200);
  await assert.rejects(response.text(), "a short body is not passed off as complete");
});

test("proxy - a port in scope with nothing behind it is 502", async (t) => {
  const { base } = await startProxy(t);
  const answer = await hello(base, token([{ allPorts: {} }]), "3001");
  assert.equal(answer.status, 502);
  assert.deepEqual(answer.body, {
    _tag: "BadGateway",
    reason: "no-listener",
    message: "the instance's app did not answer (no-listener)",
  });
});

test("proxy - strips the auth and port headers before forwarding", async (t) => {
  const { base } = await startProxy(t);
  const response = await fetch(`${base}/headers`, { headers: { ...headers(token(), "8080"), "x-custom": "kept" } });
  const seen = (await response.json()) as Record<string, string>;
  assert.equal(seen["x-custom"], "kept");
  assert.equal(seen["x-aws-proxy-auth"], undefined);
  assert.equal(seen["x-aws-proxy-port"], undefined);
  assert.equal(seen["x-instance-secret"], undefined);
  assert.equal(seen["x-forwarded-for"], "127.0.0.1");
});

test("proxy - streams an NDJSON result through", async (t) => {
  const { base } = await startProxy(t);
  const response = await fetch(`${base}/__rpc__/count`, { method: "POST", body: "[2000]", headers: headers(token()) });
  assert.equal(response.headers.get("x-alchemy-rpc-stream"), "ndjson");
  const lines = (await response.text()).trim().split("\n");
  assert.equal(lines.length, 2000);
  assert.equal(lines.at(-1), "2000");
});

test("proxy - streams a large request body both ways", async (t) => {
  const { base } = await startProxy(t);
  const payload = randomBytes(3 * 1024 * 1024);
  const response = await fetch(`${base}/echo`, {
    method: "POST",
    body: payload,
    headers: { ...headers(token()), "content-type": "application/octet-stream" },
  });
  assert.ok(Buffer.from(await response.arrayBuffer()).equals(payload));
});

test("proxy - a stopped instance process is 502 after the upstream timeout", async (t) => {
  const handle = await provider.start({ microvmId: "vm-stopped", image: builtinImages.sandbox });
  t.after(() => provider.terminate(handle));
  // The working call goes through a proxy with the default timeout: on a busy machine a first
  // answer may take longer than the 200 ms under test.
  const { base: patient } = await startProxy(t, { handle });
  assert.equal((await hello(patient, token([{ port: 8080 }], "vm-stopped"))).status, 200);
  const { base } = await startProxy(t, { handle, upstreamTimeoutMs: 200 });
  await provider.suspend(handle);
  const began = Date.now();
  const answer = await hello(base, token([{ port: 8080 }], "vm-stopped"));
  assert.equal(answer.status, 502);
  assert.equal(answer.body.reason, "timeout");
  assert.ok(Date.now() - began < 2_000);
  await provider.resume(handle);
  assert.equal((await hello(base, token([{ port: 8080 }], "vm-stopped"))).status, 200, "answers again once resumed");
});

test("proxy - a dead instance process is 502", async (t) => {
  const handle = await provider.start({ microvmId: "vm-dead", image: builtinImages.sandbox });
  const { base } = await startProxy(t, { handle, upstreamTimeoutMs: 500 });
  await provider.terminate(handle);
  const answer = await hello(base, token([{ port: 8080 }], "vm-dead"));
  assert.equal(answer.status, 502);
  assert.equal(answer.body.reason, "no-listener");
});

test("proxy - auto-resume under 20 concurrent requests resumes once", async (t) => {
  const handle = await provider.start({ microvmId: "vm-resume", image: builtinImages.sandbox });
  t.after(() => provider.terminate(handle));
  await provider.suspend(handle);
  let state: MicrovmState = "SUSPENDED";
  let resumes = 0;
  const { base } = await startProxy(t, {
    handle,
    state: () => state,
    autoResume: () => true,
    resume: async () => {
      resumes += 1;
      await provider.resume(handle);
      state = "RUNNING";
    },
  });
  const auth = token([{ port: 8080 }], "vm-resume");
  const answers = await Promise.all(Array.from({ length: 20 }, () => hello(base, auth)));
  assert.deepEqual(new Set(answers.map((answer) => `${answer.status} ${answer.body}`)), new Set(["200 hello, proxy!"]));
  assert.equal(resumes, 1);
});

test("proxy - suspended without auto-resume is 409", async (t) => {
  let resumes = 0;
  const { base } = await startProxy(t, {
    state: () => "SUSPENDED",
    autoResume: () => false,
    resume: async () => void (resumes += 1),
  });
  const answer = await hello(base, token());
  assert.equal(answer.status, 409);
  assert.equal(answer.body._tag, "MicrovmSuspended");
  assert.equal(resumes, 0);
});

test("proxy - a failed auto-resume is 503", async (t) => {
  const { base } = await startProxy(t, {
    state: () => "SUSPENDED",
    autoResume: () => true,
    resume: () => Promise.reject(new Error("cannot thaw")),
  });
  const answer = await hello(base, token());
  assert.equal(answer.status, 503);
  assert.equal(answer.body._tag, "MicrovmResumeFailed");
});

test("proxy - a starting instance is 503 with Retry-After, a terminated one 410", async (t) => {
  let state: MicrovmState = "PENDING";
  const { base } = await startProxy(t, { state: () => state });
  const pending = await fetch(`${base}/`, { headers: headers(token()) });
  assert.equal(pending.status, 503);
  assert.equal(pending.headers.get("retry-after"), "1");
  await pending.arrayBuffer();
  for (const gone of ["TERMINATING", "TERMINATED", "FAILED"] as const) {
    state = gone;
    const answer = await hello(base, token());
    assert.equal(answer.status, 410, gone);
    assert.equal(answer.body._tag, "MicrovmGone");
  }
});

test("proxy - counts authorised requests in flight and reports their start and end", async (t) => {
  const events: string[] = [];
  // A clock the test moves, so each activity time is told apart from the one before.
  let clock = Date.now();
  const { proxy, base } = await startProxy(t, {
    now: () => clock,
    hooks: { onRequestStart: (n) => events.push(`start:${n}`), onRequestEnd: (n) => events.push(`end:${n}`) },
  });
  const created = proxy.lastActivityAt;
  clock += 1_000;
  await hello(base);
  assert.deepEqual(events, [], "a refused request is not activity");
  assert.equal(proxy.lastActivityAt, created, "a refused request is not activity");
  clock += 1_000;
  const startedAt = clock;
  const sleeping = fetch(`${base}/__rpc__/sleep`, { method: "POST", body: "[300]", headers: headers(token()) });
  await until(() => proxy.inFlight === 1);
  assert.deepEqual(events, ["start:1"]);
  assert.equal(proxy.lastActivityAt, startedAt, "a request's start is activity");
  clock += 1_000;
  const endedAt = clock;
  assert.equal(await (await sleeping).json(), 300);
  await until(() => proxy.inFlight === 0);
  assert.deepEqual(events, ["start:1", "end:0"]);
  assert.equal(proxy.lastActivityAt, endedAt, "a request's end is activity");
});

test("proxy - a token that expires while unused is refused", async (t) => {
  const { base } = await startProxy(t);
  const shortLived = token([{ port: 8080 }], "vm-proxy", Date.now() - 60_000 + 600);
  assert.equal((await hello(base, shortLived)).status, 200);
  await new Promise((resolve) => setTimeout(resolve, 650));
  const answer = await hello(base, shortLived);
  assert.equal(answer.status, 403);
  assert.equal(answer.body.reason, "expired");
});

test("proxy - bad input never crashes the proxy", async (t) => {
  const { base, proxy } = await startProxy(t);
  const { port } = proxy.server.address() as AddressInfo;
  const garbage = [
    "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
    "GET / HTTP/1.1\r\nX-aws-proxy-auth: a\r\nX-aws-proxy-auth: b\r\n\r\n",
    `GET / HTTP/1.1\r\nX-aws-proxy-auth: ${"z".repeat(20_000)}\r\n\r\n`,
    `POST /__rpc__/hello HTTP/1.1\r\nX-aws-proxy-auth: ${token()}\r\nContent-Length: 100\r\n\r\n["cut`,
  ];
  for (const bytes of garbage) {
    await new Promise<void>((resolve) => {
      const socket = connect(port, "127.0.0.1", () => socket.end(bytes));
      socket
        .on("data", () => undefined)
        .on("close", () => resolve())
        .on("error", () => resolve());
    });
  }
  assert.equal((await hello(base, token())).status, 200);
  assert.equal(proxy.inFlight, 0);
});

async function until(condition: () => boolean, timeoutMs = 2_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

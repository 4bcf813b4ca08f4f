// A GET answered before is sent from the gateway's cache ahead of routing, with every header in
// one call: these check that such an answer is still the API's answer (its headers, the Host
// check, API keys) on a real HTTP server whose cache holds one entry and whose storage is absent.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { request } from "node:http";
import { createApiServer, type ApiServer } from "../gateway/index.ts";
import { parseApiKeys, sha256Hex } from "../gateway/api-keys.ts";
import type { AnsweredRead, LocalReads } from "../gateway/local-reads.ts";
import { taskApi, type Operation } from "../schemas/index.ts";
import type { NatsHandle } from "../platform/index.ts";

const KEPT_URL = "/6f1c2b9e-4b7a-4c1e-9d3f-2a5b8c7d1e0f";
const BODY = '{"id":"6f1c2b9e-4b7a-4c1e-9d3f-2a5b8c7d1e0f","title":"kept","completed":false}';
const KEY = "tsk_recalled-reads-test-key";

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** One request with exactly these headers (a `host` among them when given). */
function ask(port: number, path: string, headers: Record<string, string> = {}, method = "GET") {
  return new Promise<Answer>((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method, path, headers, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on("error", reject).end();
  });
}

/** A cache with one answer at `KEPT_URL`, counting the lookups; no read reaches storage. */
function oneKeptAnswer(op: Operation) {
  const kept: AnsweredRead = { op, body: Buffer.from(BODY), revision: 7, record: "tasks.kept" };
  const lookups: string[] = [];
  const reads: LocalReads = {
    forOperation: () => undefined,
    recall: (_api, url) => {
      lookups.push(url);
      return url === KEPT_URL ? kept : undefined;
    },
    written: () => undefined,
    revisionSeen: () => undefined,
    events: new EventEmitter(),
    confirmed: () => undefined,
    forget: () => undefined,
  };
  return { reads, lookups };
}

async function serve(options: { cors: boolean; keys?: boolean }) {
  const { reads, lookups } = oneKeptAnswer(taskApi.getTask);
  // No NATS: every request here is answered by the cache or before routing.
  const nats = { connected: () => true, nc: { info: undefined } } as unknown as NatsHandle;
  const server: ApiServer = createApiServer({
    operations: Object.values(taskApi),
    info: { title: "Task API", version: "test" },
    cors: options.cors,
    nats,
    prefix: "recalled-test",
    bodyLimit: 1024,
    requestTimeoutMs: 200,
    localReads: reads,
    apiKeys: options.keys ? parseApiKeys(`tester ${sha256Hex(KEY)}\n`) : undefined,
  });
  const port = await server.listen(0, "127.0.0.1");
  return { server, port, lookups };
}

describe("recalled reads", () => {
  let open: Awaited<ReturnType<typeof serve>>;
  let closed: Awaited<ReturnType<typeof serve>>;
  let keyed: Awaited<ReturnType<typeof serve>>;
  before(async () => {
    open = await serve({ cors: true });
    closed = await serve({ cors: false });
    keyed = await serve({ cors: true, keys: true });
  });
  after(async () => {
    for (const s of [open, closed, keyed]) await s?.server.close();
  });

  it("recalled reads - a kept answer carries the body, its etag, the request id and the API's CORS headers", async () => {
    const given = await ask(open.port, KEPT_URL, { "x-request-id": "trace-kept.1" });
    assert.equal(given.status, 200);
    assert.equal(given.body, BODY);
    assert.equal(given.headers["content-type"], "application/json");
    assert.equal(given.headers["content-length"], String(Buffer.byteLength(BODY)));
    assert.equal(given.headers.etag, '"7"');
    assert.equal(given.headers["x-request-id"], "trace-kept.1");
    assert.equal(given.headers["access-control-allow-origin"], "*");
    assert.equal(given.headers.vary, "Origin");
    const made = await ask(open.port, KEPT_URL, { "x-request-id": "not sane ü" });
    assert.match(String(made.headers["x-request-id"]), /^[0-9a-f-]{36}$/, "an unsafe id is replaced");
    const again = await ask(open.port, KEPT_URL);
    assert.notEqual(again.headers["x-request-id"], made.headers["x-request-id"], "each request has its own id");
    assert.ok(open.lookups.filter((url) => url === KEPT_URL).length >= 3, "the answers came from the cache");
  });

  it("recalled reads - an API without CORS sends none on a kept answer", async () => {
    const res = await ask(closed.port, KEPT_URL);
    assert.equal(res.status, 200);
    assert.equal(res.body, BODY);
    assert.equal(res.headers["access-control-allow-origin"], undefined);
    assert.equal(res.headers.vary, undefined);
  });

  it("recalled reads - a Host this API does not serve gets 421, not the kept answer", async () => {
    const before = open.lookups.length;
    const res = await ask(open.port, KEPT_URL, { host: "rebound.example:80" });
    assert.equal(res.status, 421);
    assert.doesNotMatch(res.body, /kept/);
    assert.equal(res.headers["access-control-allow-origin"], "*", "CORS headers on errors too");
    assert.equal(open.lookups.length, before, "the cache is not asked");
  });

  it("recalled reads - with API keys, a kept answer needs a known key", async () => {
    const before = keyed.lookups.length;
    const none = await ask(keyed.port, KEPT_URL);
    assert.equal(none.status, 401);
    assert.equal(none.headers["www-authenticate"], "Bearer");
    const wrong = await ask(keyed.port, KEPT_URL, { authorization: "Bearer tsk_not-a-key" });
    assert.equal(wrong.status, 401);
    assert.doesNotMatch(none.body + wrong.body, /kept/);
    assert.equal(keyed.lookups.length, before, "the cache is not asked without a known key");
    const known = await ask(keyed.port, KEPT_URL, { authorization: `Bearer ${KEY}` });
    assert.equal(known.status, 200);
    assert.equal(known.body, BODY);
  });

  it("recalled reads - only a GET is answered from the cache", async () => {
    const before = open.lookups.length;
    const head = await ask(open.port, KEPT_URL, {}, "HEAD");
    const post = await ask(open.port, KEPT_URL, {}, "POST");
    // A HEAD is routed like a GET, to storage, which this server lacks.
    assert.equal(head.status, 503, `HEAD: ${head.status} ${head.body}`);
    assert.equal(post.status, 404, `POST: ${post.status} ${post.body}`);
    assert.doesNotMatch(post.body, /kept/);
    assert.equal(open.lookups.length, before);
  });
});

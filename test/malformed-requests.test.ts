// Requests Node's HTTP parser rejects before routing still get a JSON error with a `_tag`:
// a raw non-ASCII URL, an invalid header, oversized headers.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "node:net";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

const defer = lifo(after);
let service: TestService;

before(async () => {
  service = await startService(defer);
});

/** Writes `raw` on a fresh connection and resolves with everything the server sends back. */
function exchange(base: string, raw: Buffer): Promise<{ status: number; headers: string; body: string }> {
  const { port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), "127.0.0.1", () => socket.end(raw));
    let text = "";
    socket.on("data", (chunk) => (text += chunk.toString("utf8")));
    socket.on("error", reject);
    socket.on("close", () => {
      const [head = "", body = ""] = text.split("\r\n\r\n");
      resolve({ status: Number(head.split(" ")[1]), headers: head.toLowerCase(), body });
    });
  });
}

test("malformed requests - a raw non-ASCII byte in the query is a JSON 400 with a hint", async () => {
  const raw = Buffer.concat([
    Buffer.from("GET /?jobId=0b5e"),
    Buffer.from("…", "utf8"),
    Buffer.from(" HTTP/1.1\r\nHost: localhost\r\n\r\n"),
  ]);
  const answer = await exchange(service.jobUrl, raw);
  assert.equal(answer.status, 400);
  assert.match(answer.headers, /content-type: application\/json/);
  const body = JSON.parse(answer.body) as { _tag: string; message: string };
  assert.equal(body._tag, "HttpApiDecodeError");
  assert.match(body.message, /percent-encoded/);
});

test("malformed requests - an invalid header line is a JSON 400", async () => {
  const answer = await exchange(
    service.taskUrl,
    Buffer.from("GET /x HTTP/1.1\r\nHost: localhost\r\nbad header\r\n\r\n"),
  );
  assert.equal(answer.status, 400);
  assert.equal((JSON.parse(answer.body) as { _tag: string })._tag, "HttpApiDecodeError");
});

test("malformed requests - headers past the limit are a JSON 431", async () => {
  const answer = await exchange(
    service.taskUrl,
    Buffer.from(`GET /x HTTP/1.1\r\nHost: localhost\r\nx-big: ${"a".repeat(64 * 1024)}\r\n\r\n`),
  );
  assert.equal(answer.status, 431);
  assert.equal((JSON.parse(answer.body) as { _tag: string })._tag, "RequestHeaderFieldsTooLarge");
});

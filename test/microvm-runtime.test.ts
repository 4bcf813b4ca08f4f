// Tests of the runtime's RPC wire and fetch fallthrough, method by method, against the
// sandbox image running in a real (sandboxed) instance process.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "node:net";
import { builtinImages, createProcessProvider, type MicrovmHandle } from "../vm-runtime/service/index.ts";
import { childProcessesWith } from "../vm-runtime/host/proc.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";

const provider = createProcessProvider();
let base = "";
let instance: MicrovmHandle;

before(async () => {
  instance = await provider.start({ microvmId: "runtime-test", image: builtinImages.sandbox });
  base = `http://127.0.0.1:${instance.ports["8080"]}`;
});

after(async () => {
  await provider.close();
  assert.deepEqual(childProcessesWith(process.pid, INSTANCE_MARKER), [], "an instance process was left running");
});

/** fetch to the runtime with the instance secret the proxy would add. */
function get(path: string, init: RequestInit = {}): Promise<Response> {
  return fetch(`${base}${path}`, {
    ...init,
    headers: { ...instance.upstreamHeaders, ...(init.headers as Record<string, string>) },
  });
}

async function rpc(method: string, body?: string, init: RequestInit = {}) {
  const response = await get(`/__rpc__/${method}`, {
    method: "POST",
    ...(body === undefined ? {} : { body }),
    ...init,
  });
  const text = await response.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json: json as any };
}

test("runtime - a request without the instance secret is refused, so only the proxy gets in", async () => {
  for (const path of ["/__rpc__/hello", "/__rpc__/", "/echo?message=x"]) {
    const response = await fetch(`${base}${path}`, {
      method: path === "/__rpc__/hello" ? "POST" : "GET",
      body: path === "/__rpc__/hello" ? '["x"]' : null,
    });
    assert.equal(response.status, 403, path);
    assert.equal(((await response.json()) as { _tag: string })._tag, "Forbidden");
  }
  const wrong = await fetch(`${base}/echo?message=x`, { headers: { "x-instance-secret": "guess" } });
  assert.equal(wrong.status, 403);
  await wrong.arrayBuffer();
});

test("runtime - the image never sees the instance secret", async () => {
  const seen = (await (await get("/headers")).json()) as Record<string, string>;
  assert.equal(seen["x-instance-secret"], undefined);
});

test("runtime - hello answers 200 with the JSON result", async () => {
  const answer = await rpc("hello", '["world"]');
  assert.equal(answer.status, 200);
  assert.equal(answer.headers.get("content-type"), "application/json");
  assert.equal(answer.json, "hello, world!");
});

test("runtime - the method name is percent-decoded", async () => {
  assert.equal((await rpc("hel%6Co", '["x"]')).json, "hello, x!");
});

test("runtime - an empty body means no arguments", async () => {
  for (const body of ["", undefined, "  \n"]) {
    const answer = await rpc("nothing", body);
    assert.equal(answer.status, 200, JSON.stringify(body));
    assert.equal(answer.text, "null");
  }
});

test("runtime - an undefined result is null", async () => {
  const answer = await rpc("nothing", "[]");
  assert.equal(answer.status, 200);
  assert.equal(answer.text, "null");
});

test("runtime - a number result and several arguments", async () => {
  assert.equal((await rpc("add", "[2, 3]")).json, 5);
});

test("runtime - arguments violating the schema are 400 with issues", async () => {
  const answer = await rpc("hello", "[42]");
  assert.equal(answer.status, 400);
  assert.equal(answer.json._tag, "~alchemy/rpc/error");
  assert.equal(answer.json.error._tag, "RpcInvalidArguments");
  assert.deepEqual(answer.json.error.issues[0].path, [0]);
  assert.equal(typeof answer.json.error.message, "string");
  assert.equal((await rpc("hello", "[]")).status, 400, "too few arguments");
  assert.equal((await rpc("hello", '["a", "b"]')).status, 400, "too many arguments");
  assert.equal((await rpc("add", "")).status, 400, "empty body is [] and add needs two");
});

test("runtime - invalid JSON is 400", async () => {
  for (const body of ["{", "[1,", "nope", "\u0000"]) {
    const answer = await rpc("hello", body);
    assert.equal(answer.status, 400, body);
    assert.equal(answer.json.error._tag, "RpcBadRequest");
  }
});

test("runtime - a body that is not a JSON array is 400", async () => {
  for (const body of ['{"0":"x"}', '"world"', "42", "null", "true"]) {
    const answer = await rpc("hello", body);
    assert.equal(answer.status, 400, body);
    assert.equal(answer.json._tag, "~alchemy/rpc/error");
  }
});

test("runtime - an unknown method is 404", async () => {
  const answer = await rpc("nope", "[]");
  assert.equal(answer.status, 404);
  assert.equal(answer.json.error._tag, "RpcMethodNotFound");
});

test("runtime - inherited names are 404", async () => {
  for (const name of [
    "constructor",
    "toString",
    "__proto__",
    "hasOwnProperty",
    "valueOf",
    "isPrototypeOf",
    "__defineGetter__",
  ]) {
    assert.equal((await rpc(encodeURIComponent(name), "[]")).status, 404, name);
  }
});

test("runtime - names with slashes or odd encodings are 404 or 400, never 500", async () => {
  assert.equal((await rpc("hello/extra", '["x"]')).status, 404);
  assert.equal((await rpc("%2Fhello", '["x"]')).status, 404);
  assert.equal((await rpc("", "[]")).status, 404);
  assert.equal((await rpc("%E0%A4%A", "[]")).status, 400);
});

test("runtime - a tagged error carries its tag, fields, message and declared status, not its stack", async () => {
  const answer = await rpc("lucky", "[13]");
  assert.equal(answer.status, 418);
  assert.deepEqual(answer.json, {
    _tag: "~alchemy/rpc/error",
    error: { _tag: "Unlucky", number: 13, status: 418, name: "Unlucky", message: "13 is an unlucky number" },
  });
  assert.ok(!answer.text.includes("stack") && !answer.text.includes(".ts:"));
});

test("runtime - an untagged error is 500 with its message only", async () => {
  const answer = await rpc("crash", "[]");
  assert.equal(answer.status, 500);
  assert.deepEqual(answer.json, { _tag: "~alchemy/rpc/error", error: { message: "boom" } });
});

test("runtime - non-POST on /__rpc__/ is 405", async () => {
  for (const method of ["GET", "PUT", "DELETE", "PATCH"]) {
    const response = await get("/__rpc__/hello", { method });
    assert.equal(response.status, 405, method);
    assert.equal(response.headers.get("allow"), "POST");
    await response.arrayBuffer();
  }
});

test("runtime - GET /__rpc__/ is the readiness probe, listing the image's methods", async () => {
  const response = await get("/__rpc__/");
  assert.equal(response.status, 200);
  const body = (await response.json()) as { _tag: string; status: string; methods: { name: string; args?: unknown }[] };
  assert.equal(body._tag, "~alchemy/rpc/health");
  assert.equal(body.status, "ok");
  const hello = body.methods.find((m) => m.name === "hello");
  assert.deepEqual(hello?.args, {
    type: "array",
    items: [{ type: "string" }],
    additionalItems: false,
    minItems: 1,
    maxItems: 1,
  });
});

test("runtime - only the path prefix selects RPC", async () => {
  for (const path of ["/?__rpc__", "/__rpc__", "/x/__rpc__/hello", "/?path=/__rpc__/hello", "//__rpc__/hello"]) {
    const response = await get(path, { method: "POST", body: '["x"]' });
    assert.equal(response.status, 200, path);
    assert.match(await response.text(), /^sandbox: POST /, path);
  }
});

test("runtime - GET /echo answers the message as text", async () => {
  const response = await get(`/echo?message=${encodeURIComponent("hi there ✓")}`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get("content-type") ?? "", /^text\/plain/);
  assert.equal(await response.text(), "hi there ✓");
});

test("runtime - other paths get the image's plain-text answer", async () => {
  const response = await get("/anything/else");
  assert.equal(await response.text(), "sandbox: GET /anything/else\n");
});

test("runtime - request bodies stream to the fetch handler and back", async () => {
  const payload = "x".repeat(300_000);
  const response = await get("/echo", { method: "POST", body: payload, headers: { "content-type": "text/plain" } });
  assert.equal(await response.text(), payload);
});

test("runtime - a streamed method answers NDJSON", async () => {
  const answer = await rpc("count", "[5]");
  assert.equal(answer.status, 200);
  assert.equal(answer.headers.get("x-alchemy-rpc-stream"), "ndjson");
  assert.equal(answer.text, "1\n2\n3\n4\n5\n");
});

test("runtime - a stream that fails part-way ends with a stream-error line", async () => {
  const answer = await rpc("countThenFail", "[5, 2]");
  assert.equal(answer.status, 200);
  const lines = answer.text
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line));
  assert.deepEqual(lines, [
    1,
    2,
    {
      _tag: "~alchemy/rpc/stream-error",
      error: { _tag: "CountInterrupted", at: 2, message: "count interrupted after 2" },
    },
  ]);
});

test("runtime - a body over the limit is 413", async () => {
  const answer = await rpc("hello", JSON.stringify(["x".repeat(1024 * 1024 + 10)]));
  assert.equal(answer.status, 413);
  assert.equal(answer.json.error._tag, "RpcPayloadTooLarge");
});

test("runtime - a caller leaving a stream early does not hurt the runtime", async () => {
  const controller = new AbortController();
  const response = await get("/__rpc__/count", { method: "POST", body: "[100000]", signal: controller.signal });
  const reader = response.body!.getReader();
  await reader.read();
  controller.abort();
  await reader.closed.catch(() => undefined);
  assert.equal((await rpc("hello", '["still here"]')).json, "hello, still here!");
});

test("runtime - garbage on the socket never crashes the runtime", async () => {
  for (const garbage of [
    "\x00\x01\x02\r\n\r\n",
    "GET / HTTP/9.9\r\n\r\n",
    "POST /__rpc__/hello HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    "GET * HTTP/1.1\r\nHost: x\r\n\r\n",
  ]) {
    await new Promise<void>((resolve) => {
      const socket = connect(instance.ports["8080"]!, "127.0.0.1", () => socket.end(garbage));
      socket
        .on("data", () => undefined)
        .on("close", () => resolve())
        .on("error", () => resolve());
    });
  }
  assert.equal((await rpc("hello", '["ok"]')).json, "hello, ok!");
});

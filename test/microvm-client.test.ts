// Tests of the client stub through a real proxy to a real sandbox instance: typed calls,
// typed errors, streams (including a failure part-way), fetch, and proxy refusals.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import {
  builtinImages,
  createAuthToken,
  createInstanceProxy,
  createProcessProvider,
  upstreamOf,
  type InstanceProxy,
  type MicrovmHandle,
} from "../vm-runtime/service/index.ts";
import { childProcessesWith } from "../vm-runtime/host/proc.ts";
import {
  connectMicrovm,
  isRpcError,
  microvmConnection,
  MicrovmRpcError,
  type SandboxShape,
} from "../vm-runtime/index.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";

const key = randomBytes(32);
const provider = createProcessProvider();
let handle: MicrovmHandle;
let proxy: InstanceProxy;
let endpoint = "";

before(async () => {
  handle = await provider.start({ microvmId: "vm-client", image: builtinImages.sandbox });
  proxy = createInstanceProxy({
    microvmId: "vm-client",
    tokenKey: key,
    state: () => "RUNNING",
    resolveUpstream: (port) => upstreamOf(handle, port),
    upstreamHeaders: () => handle.upstreamHeaders,
  });
  endpoint = await proxy.listen();
});

after(async () => {
  await proxy.close();
  await provider.close();
  assert.deepEqual(childProcessesWith(process.pid, INSTANCE_MARKER), [], "an instance process was left running");
});

const authToken = () =>
  createAuthToken({ microvmId: "vm-client", expirationInMinutes: 5, allowedPorts: [{ port: 8080 }] }, key).token;
const connectSandbox = () => connectMicrovm<SandboxShape>({ endpoint, authToken: authToken() });

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const values: T[] = [];
  for await (const value of iterable) values.push(value);
  return values;
}

/** Compile-time only: the stub's types come from the image. Never called. */
export function typeChecks(stub: SandboxShape): void {
  const greeting: Promise<string> = stub.hello("world");
  const sum: Promise<number> = stub.add(1, 2);
  const nothing: Promise<null> = stub.nothing();
  const counted: Promise<AsyncIterable<number>> = stub.count(3);
  void [greeting, sum, nothing, counted];
  // @ts-expect-error hello takes a string
  void stub.hello(42);
  // @ts-expect-error no such method
  void stub.goodbye();
}

test("client - a typed call resolves with the method's result", async () => {
  const stub = connectSandbox();
  assert.equal(await stub.hello("world"), "hello, world!");
  assert.equal(await stub.add(2, 3), 5);
  assert.equal(await stub.nothing(), null);
});

test("client - a tagged error rejects with its tag, fields and status", async () => {
  const stub = connectSandbox();
  await assert.rejects(stub.lucky(13), (error: unknown) => {
    assert.ok(isRpcError<{ _tag: "Unlucky"; number: number; message: string }>(error, "Unlucky"));
    assert.equal(error.status, 418);
    assert.equal(error.source, "rpc");
    assert.equal(error.error.number, 13);
    assert.equal(error.message, "13 is an unlucky number");
    return true;
  });
  assert.equal(await stub.lucky(7), 7);
});

test("client - an untagged error rejects with its message and status 500", async () => {
  await assert.rejects(connectSandbox().crash(), (error: unknown) => {
    assert.ok(error instanceof MicrovmRpcError);
    assert.equal(error._tag, undefined);
    assert.equal(error.status, 500);
    assert.equal(error.message, "boom");
    return true;
  });
});

test("client - arguments violating the schema reject with the issues", async () => {
  const connection = microvmConnection({ endpoint, authToken: authToken() });
  await assert.rejects(connection.call("hello", [42]), (error: unknown) => {
    assert.ok(isRpcError(error, "RpcInvalidArguments"));
    assert.equal(error.status, 400);
    assert.deepEqual((error.error.issues as Array<{ path: unknown }>)[0]?.path, [0]);
    return true;
  });
});

test("client - an unknown method rejects with RpcMethodNotFound", async () => {
  const stub = connectMicrovm({ endpoint, authToken: authToken() });
  await assert.rejects(
    stub.nope!(),
    (error: unknown) => isRpcError(error, "RpcMethodNotFound") && error.status === 404,
  );
});

test("client - a streamed method resolves to an async iterable", async () => {
  assert.deepEqual(await collect(await connectSandbox().count(5)), [1, 2, 3, 4, 5]);
});

test("client - a stream failing part-way yields its values, then rejects with the error", async () => {
  const values: number[] = [];
  await assert.rejects(
    (async () => {
      for await (const value of await connectSandbox().countThenFail(5, 2)) values.push(value);
    })(),
    (error: unknown) => isRpcError(error, "CountInterrupted") && error.source === "stream" && error.error.at === 2,
  );
  assert.deepEqual(values, [1, 2]);
});

test("client - leaving a stream early cancels it", async () => {
  const stub = connectSandbox();
  const seen: number[] = [];
  for await (const value of await stub.count(100_000)) {
    seen.push(value);
    if (seen.length === 3) break;
  }
  assert.deepEqual(seen, [1, 2, 3]);
  assert.equal(await stub.hello("after"), "hello, after!");
});

test("client - stub.fetch reaches the image's fetch handler", async () => {
  const stub = connectSandbox();
  assert.equal(await (await stub.fetch("/echo?message=hi")).text(), "hi");
  const posted = await stub.fetch("/echo", { method: "POST", body: "ping", headers: { "content-type": "text/plain" } });
  assert.equal(await posted.text(), "ping");
});

test("client - accepts CreateAuthToken's authToken object and an explicit port", async () => {
  const stub = connectMicrovm<SandboxShape>({
    endpoint: `http://${endpoint}/`,
    authToken: { "X-aws-proxy-auth": authToken() },
    port: 8080,
  });
  assert.equal(await stub.hello("object"), "hello, object!");
});

test("client - a proxy refusal rejects with the proxy's tag", async () => {
  const stub = connectMicrovm<SandboxShape>({ endpoint, authToken: "forged.token" });
  await assert.rejects(stub.hello("x"), (error: unknown) => {
    assert.ok(isRpcError(error, "MicrovmProxyForbidden"));
    assert.equal(error.source, "proxy");
    assert.equal(error.status, 403);
    return true;
  });
});

test("client - the stub is not thenable", async () => {
  const stub = connectSandbox();
  assert.equal((stub as unknown as { then?: unknown }).then, undefined);
  assert.equal(await Promise.resolve(stub), stub);
});

// Their speed is a benchmark row, not a timed test: `npm run bench -- --microvm`, "stub.hello
// via host proxy (client stub)" (sequential p50/p99, and req/s with concurrent callers).
test("client - sequential round trips through the proxy each get their own answer", async (t) => {
  const stub = connectSandbox();
  const calls = 300;
  const began = performance.now();
  for (let i = 0; i < calls; i++) assert.equal(await stub.hello(String(i)), `hello, ${i}!`);
  t.diagnostic(
    `sequential hello via client → proxy → runtime: ${((performance.now() - began) / calls).toFixed(3)} ms per call`,
  );
});

test("client - an injected fetch carries the RPC calls, streams and refusals too", async () => {
  const seen: string[] = [];
  const fetchImpl: typeof globalThis.fetch = (input, init) => {
    seen.push(String(input));
    return fetch(input, init);
  };
  const stub = connectMicrovm<SandboxShape>({ endpoint, authToken: authToken(), fetch: fetchImpl });
  assert.equal(await stub.hello("injected"), "hello, injected!");
  assert.deepEqual(await collect(await stub.count(3)), [1, 2, 3]);
  const forged = connectMicrovm<SandboxShape>({ endpoint, authToken: "forged.token", fetch: fetchImpl });
  await assert.rejects(
    forged.hello("x"),
    (error: unknown) => isRpcError(error, "MicrovmProxyForbidden") && error.status === 403,
  );
  assert.equal(seen.length, 3);
});

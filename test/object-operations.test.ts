// The object operations on a real NATS behind a real microVM API listener, with API keys: a
// call's answer relayed as the object gave it (over HTTP and NATS), the contracts' 400s and
// 404s, the directory (get, list by pages, delete clearing storage and alarm), and principals
// that never see each other's objects. The host's activations are a fake here (test below): they
// list an object when its call runs, and delete one as a holder does.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import type { Msg } from "@nats-io/transport-node";
import { serveApi } from "../actors/serve.ts";
import { createApiServer, newApiKey, parseApiKeys } from "../gateway/index.ts";
import type { NatsHandle, Requester } from "../platform/index.ts";
import {
  answerValue,
  ImageNotFound,
  NotAnObject,
  ObjectBusy,
  objectApi,
  openApiDocument,
  PRINCIPAL_HEADER,
  viaGateway,
} from "../schemas/index.ts";
import {
  eraseObject,
  objectAlarms,
  objectDirectory,
  objectHandlers,
  objectKey,
  objectStores,
  type ObjectActivations,
  type ObjectAnswer,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import { isRpcError, object } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import { objectsNats, testLease, withoutLogs, type ObjectsNats } from "./helpers/objects.ts";

const defer = lifo(after);
const alice = newApiKey("alice");
const bob = newApiKey("bob");
const keys = parseApiKeys(`${alice.line}\n${bob.line}\n`);

/**
 * Activations of a counter image (`counter`: `inc(by)` stores and answers the count; `fail`
 * throws a tagged error with status 418; `slow` stands for a full mailbox), an image that is not
 * an object (`plain`) and none other. Calls write real storage under a test lease.
 */
function fakeActivations(host: NatsHandle): ObjectActivations & { calls: string[] } {
  const stores = objectStores(host.requester);
  const remains = { stores, alarms: objectAlarms(host.requester), directory: objectDirectory(host.requester) };
  const active = new Map<string, string>();
  const calls: string[] = [];
  const answer = (status: number, value: unknown): ObjectAnswer => ({
    status,
    body: Buffer.from(JSON.stringify(value)),
  });
  return {
    calls,
    async call(object, method, args) {
      calls.push(`${object.principal}/${object.image}/${object.name}/${method}(${JSON.stringify(args)})`);
      if (object.image === "plain") throw NotAnObject.make({ image: object.image });
      if (object.image !== "counter") throw ImageNotFound.make({ imageIdentifier: object.image });
      if (method === "vanish") throw ImageNotFound.make({ imageIdentifier: object.image });
      if (method === "slow")
        throw ObjectBusy.make({ image: object.image, name: object.name, retryAfterSeconds: 2, message: "busy" });
      const lease = testLease(host, object, "host-a");
      await lease.claim();
      active.set(objectKey(object), "host-a");
      await remains.directory.enter(object);
      if (method === "fail")
        return answer(418, { _tag: "~alchemy/rpc/error", error: { _tag: "Teapot", spout: 1, message: "no coffee" } });
      const storage = stores.open(object, lease.fence);
      const count = ((await storage.get("n")) as number | undefined) ?? 0;
      const next = count + ((args[0] as number | undefined) ?? 1);
      await storage.put("n", next);
      return answer(200, next);
    },
    async deactivate(object) {
      active.delete(objectKey(object));
    },
    async delete(object) {
      active.delete(objectKey(object));
      const lease = testLease(host, object, "host-a");
      await lease.claim();
      await eraseObject(remains, object, lease.renew);
    },
    activeOn: async (object) => active.get(objectKey(object)),
    close: async () => undefined,
  };
}

let env: ObjectsNats;
let host: NatsHandle;
let activations: ReturnType<typeof fakeActivations>;
let url: string;

before(async () => {
  env = await objectsNats(defer);
  host = await env.as("microvms");
  activations = fakeActivations(host);
  const handlers = objectHandlers({
    ...withoutLogs,
    activations,
    directory: objectDirectory(host.requester),
    stores: objectStores(host.requester),
    alarms: objectAlarms(host.requester),
  });
  // As the host serves them: the public subjects as `nats:internal`, the gateway's copies as its header says.
  const queue = (op: { name: string }) => `objects.${op.name}`;
  const served = [
    serveApi(host.nc, objectApi, handlers, { prefix: "", queue, principal: () => "nats:internal" }),
    serveApi(host.nc, objectApi, handlers, {
      prefix: "",
      queue,
      serveAs: viaGateway,
      principal: (msg) => msg.headers?.get(PRINCIPAL_HEADER) || undefined,
    }),
  ];
  defer(async () => {
    for (const sub of served.flatMap((s) => s.shared)) await sub.drain();
  });
  await host.nc.flush();
  const gateway = createApiServer({
    nats: await env.as("gateway"),
    prefix: "",
    bodyLimit: 1024 * 1024,
    requestTimeoutMs: 10_000,
    operations: Object.values(objectApi),
    info: { title: "objects", version: "1" },
    jsonOnly: true,
    apiKeys: keys,
  });
  const port = await gateway.listen(0, "127.0.0.1");
  defer(() => gateway.close());
  url = `http://127.0.0.1:${port}/2025-09-09/objects`;
});

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: an answer's JSON, read field by field
  json: any;
}

/** An HTTP request as `key`'s principal; `body` sent as it is (a string) with a JSON content type. */
async function http(method: string, path: string, key = alice.key, body?: string, type = "application/json") {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(method === "POST" ? { "content-type": type } : {}) },
    ...(body === undefined ? {} : { body }),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = text === "" ? undefined : JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json } as Answer;
}

const path = (image: string, name: string) => `/${encodeURIComponent(image)}/${encodeURIComponent(name)}`;

describe("object operations - calls", () => {
  it("object operations - a call answers the method's JSON result; an empty body is no arguments", async () => {
    const name = "calls a/b?c";
    const first = await http("POST", `${path("counter", name)}/rpc/inc`, alice.key, "[5]");
    assert.equal(first.status, 200, first.text);
    assert.equal(first.json, 5);
    const second = await http("POST", `${path("counter", name)}/rpc/inc`, alice.key, "");
    assert.equal(second.json, 6);
    assert.equal(activations.calls.at(-1), `alice/counter/${name}/inc([])`);
  });

  it("object operations - a thrown error is relayed with its status and body, over HTTP and NATS", async () => {
    const thrown = await http("POST", `${path("counter", "relay")}/rpc/fail`, alice.key, "[]");
    assert.equal(thrown.status, 418);
    assert.equal(
      thrown.text,
      JSON.stringify({ _tag: "~alchemy/rpc/error", error: { _tag: "Teapot", spout: 1, message: "no coffee" } }),
    );
    const internal = await env.as("internal");
    const msg = await internal.nc.request(
      "objects.call",
      JSON.stringify({ image: "counter", name: "relay", method: "fail", args: [] }),
      { timeout: 5_000 },
    );
    assert.equal(msg.headers?.get("Nats-Service-Error-Code"), "418");
    assert.equal(msg.headers?.get("Nats-Service-Error"), "~alchemy/rpc/error");
    assert.equal(msg.json<{ error: { _tag: string } }>().error._tag, "Teapot");
    const ok = await internal.nc.request(
      "objects.call",
      JSON.stringify({ image: "counter", name: "relay", method: "inc" }),
      { timeout: 5_000 },
    );
    assert.equal(ok.headers?.get("Nats-Service-Error-Code") ?? "", "");
    assert.equal(ok.json(), 1);
  });

  it("object operations - bad bodies and names are 400s, a body not sent as JSON a 415", async () => {
    const rpc = `${path("counter", "bad")}/rpc/inc`;
    for (const body of ['{"by":1}', "5", "not json", '"text"']) {
      const answer = await http("POST", rpc, alice.key, body);
      assert.equal(answer.status, 400, body);
      assert.equal(answer.json._tag, "HttpApiDecodeError", body);
    }
    const long = await http("POST", `${path("counter", "x".repeat(257))}/rpc/inc`, alice.key, "[]");
    assert.equal(long.status, 400);
    const image = await http("POST", `${path("Not_An_Image", "a")}/rpc/inc`, alice.key, "[]");
    assert.equal(image.status, 400);
    const typed = await http("POST", rpc, alice.key, "[]", "text/plain");
    assert.equal(typed.status, 415);
    assert.ok(!activations.calls.some((call) => call.includes("/bad/")), "no bad request reached the object");
  });

  it("object operations - a missing image is a 404, an image that is no object a 400, and neither is listed", async () => {
    const missing = await http("POST", `${path("nosuch", "m")}/rpc/inc`, alice.key, "[]");
    assert.equal(missing.status, 404);
    assert.equal(missing.json._tag, "ImageNotFound");
    const plain = await http("POST", `${path("plain", "p")}/rpc/inc`, alice.key, "[]");
    assert.equal(plain.status, 400);
    assert.equal(plain.json._tag, "NotAnObject");
    assert.equal((await http("GET", path("nosuch", "m"))).status, 404);
    assert.equal((await http("GET", path("plain", "p"))).status, 404);
  });

  it("object operations - an object listed before stays listed when its image goes missing", async () => {
    await http("POST", `${path("counter", "kept")}/rpc/inc`, alice.key, "[1]");
    // Another host (its own directory, which has not seen the object) takes the call.
    const elsewhere = objectHandlers({
      ...withoutLogs,
      activations,
      directory: objectDirectory(host.requester),
      stores: objectStores(host.requester),
      alarms: objectAlarms(host.requester),
    });
    const call = { image: "counter", name: "kept", method: "vanish", args: [] };
    await assert.rejects(elsewhere.callObject(call, { principal: "alice" } as never), { _tag: "ImageNotFound" });
    assert.equal((await http("GET", path("counter", "kept"))).status, 200);
  });

  it("object operations - the OpenAPI document declares the call's body as the argument array", () => {
    // biome-ignore lint/suspicious/noExplicitAny: a JSON document, read by path
    const doc = openApiDocument(Object.values(objectApi), { title: "objects", version: "1" }) as any;
    const call = doc.paths["/2025-09-09/objects/{image}/{name}/rpc/{method}"].post;
    assert.equal(call.requestBody.required, false);
    assert.equal(call.requestBody.content["application/json"].schema.type, "array");
    assert.deepEqual(
      call.parameters.map((p: { name: string }) => p.name),
      ["image", "name", "method"],
    );
  });

  it("object operations - a busy object is a 429 with Retry-After", async () => {
    const busy = await http("POST", `${path("counter", "busy")}/rpc/slow`, alice.key, "[]");
    assert.equal(busy.status, 429);
    assert.equal(busy.json._tag, "ObjectBusy");
    assert.equal(busy.headers.get("retry-after"), "2");
  });
});

describe("object operations - the directory", () => {
  it("object operations - get describes an object: active, where, its storage bytes and alarm", async () => {
    assert.equal((await http("GET", path("counter", "described"))).json._tag, "ObjectNotFound");
    await http("POST", `${path("counter", "described")}/rpc/inc`, alice.key, "[3]");
    const object: ObjectRef = { principal: "alice", image: "counter", name: "described" };
    const at = await objectAlarms(host.requester).set(object, Date.now() + 3_600_000);
    const got = await http("GET", path("counter", "described"));
    assert.equal(got.status, 200, got.text);
    assert.deepEqual(got.json, {
      image: "counter",
      name: "described",
      active: true,
      activeOn: "host-a",
      // The key token "bg" and the value "3".
      storageBytes: 3,
      alarmAt: at,
    });
  });

  it("object operations - delete stops the activation and removes storage, alarm and the object", async () => {
    const object: ObjectRef = { principal: "alice", image: "counter", name: "deleted" };
    await http("POST", `${path("counter", "deleted")}/rpc/inc`, alice.key, "[7]");
    await objectAlarms(host.requester).set(object, Date.now() + 3_600_000);
    const deleted = await http("DELETE", path("counter", "deleted"));
    assert.equal(deleted.status, 204);
    assert.equal(deleted.text, "");
    assert.equal(await activations.activeOn(object), undefined);
    assert.equal(await objectAlarms(host.requester).get(object), null);
    assert.equal(await objectStores(host.requester).usage.objectBytes(objectKey(object)), 0);
    const gone = await http("GET", path("counter", "deleted"));
    assert.equal(gone.status, 404);
    assert.equal((await http("DELETE", path("counter", "deleted"))).status, 404);
    // Called again, it starts from nothing.
    assert.equal((await http("POST", `${path("counter", "deleted")}/rpc/inc`, alice.key, "[1]")).json, 1);
  });

  it("object operations - another principal's object is a 404 to get and delete and absent from its list", async () => {
    await http("POST", `${path("counter", "alice only")}/rpc/inc`, alice.key, "[1]");
    assert.equal((await http("GET", path("counter", "alice only"), bob.key)).json._tag, "ObjectNotFound");
    assert.equal((await http("DELETE", path("counter", "alice only"), bob.key)).status, 404);
    assert.deepEqual((await http("GET", "?limit=1000", bob.key)).json, { items: [] });
    // Bob's object of the same image and name is another object.
    assert.equal((await http("POST", `${path("counter", "alice only")}/rpc/inc`, bob.key, "[10]")).json, 10);
    assert.equal((await http("POST", `${path("counter", "alice only")}/rpc/inc`, alice.key, "[1]")).json, 2);
    const bobs = (await http("GET", "", bob.key)).json.items.map((item: { name: string }) => item.name);
    assert.deepEqual(bobs, ["alice only"]);
    assert.equal((await http("GET", path("counter", "alice only"))).status, 200);
  });
});

/** `requester` counting its requests and the replies they got, per stream of the direct gets. */
function counting(requester: Requester) {
  const replies = new Map<string, number>();
  const requests = new Map<string, number>();
  const bump = (map: Map<string, number>, key: string) => map.set(key, (map.get(key) ?? 0) + 1);
  const wrapped = new Proxy(requester, {
    get(target, property) {
      if (property === "request")
        return (subject: string, data: never, timeoutMs: number, h: never, signal: never) =>
          wrapped.requestMany(subject, data, timeoutMs, undefined, h, signal);
      if (property !== "requestMany") {
        const value = Reflect.get(target, property, target);
        return typeof value === "function" ? value.bind(target) : value;
      }
      return (
        subject: string,
        data: never,
        timeoutMs: number,
        last: ((m: Msg) => boolean) | undefined,
        ...rest: never[]
      ) => {
        const key = subject.replace(/^\$JS\.API\.DIRECT\.GET\.(\w+).*$/, "$1");
        bump(requests, key);
        return target.requestMany(
          subject,
          data,
          timeoutMs,
          (msg) => {
            bump(replies, key);
            return last ? last(msg) : true;
          },
          ...rest,
        );
      };
    },
  });
  return { requester: wrapped, requests, replies };
}

describe("object operations - lists cost a page", () => {
  it("object operations - a page of 10,000 objects reads one page; the walk lists each object once", async () => {
    const directory = objectDirectory(host.requester);
    const mine = Array.from({ length: 10_000 }, (_, i) => ({ principal: "many", image: "counter", name: `o${i}` }));
    const others = Array.from({ length: 500 }, (_, i) => ({ principal: "few", image: "counter", name: `o${i}` }));
    const another = Array.from({ length: 50 }, (_, i) => ({ principal: "many", image: "other", name: `x${i}` }));
    const all = [...mine, ...others, ...another].sort(() => Math.random() - 0.5);
    for (let i = 0; i < all.length; i += 1_000)
      await Promise.all(all.slice(i, i + 1_000).map((o) => directory.enter(o)));

    const counted = counting(host.requester);
    const handlers = objectHandlers({
      ...withoutLogs,
      activations,
      directory: objectDirectory(counted.requester),
      stores: objectStores(counted.requester),
      alarms: objectAlarms(counted.requester),
    });
    const context = { principal: "many" } as never;
    const page = answerValue(await handlers.listObjects({ limit: "100", image: "counter" }, context));
    assert.equal(page.items.length, 100);
    assert.ok(page.cursor);
    // One request for the page of the directory: its 100 records and the end of the batch.
    assert.equal(counted.requests.get("KV_objects"), 1);
    assert.equal(counted.replies.get("KV_objects"), 101);
    // Each object's bytes and alarm: a page's worth of replies, whatever the directory holds.
    assert.ok(
      (counted.replies.get("OBJECT_USAGE") ?? 0) <= 101,
      `usage replies ${counted.replies.get("OBJECT_USAGE")}`,
    );
    assert.ok(
      (counted.replies.get("OBJECT_ALARMS") ?? 0) <= 101,
      `alarm replies ${counted.replies.get("OBJECT_ALARMS")}`,
    );

    const seen = new Set<string>();
    let cursor: string | undefined;
    let pages = 0;
    do {
      const next = answerValue(
        await handlers.listObjects(
          { limit: "1000", image: "counter", ...(cursor === undefined ? {} : { cursor }) },
          context,
        ),
      );
      for (const item of next.items) {
        assert.ok(!seen.has(item.name), `${item.name} listed twice`);
        assert.equal(item.image, "counter");
        seen.add(item.name);
      }
      cursor = next.cursor;
      pages++;
    } while (cursor !== undefined);
    assert.equal(seen.size, 10_000);
    assert.ok(pages <= 11, `${pages} pages`);
    const everything = answerValue(await handlers.listObjects({ limit: "1000" }, { principal: "few" } as never));
    assert.equal(everything.items.length, 500);
    assert.equal(everything.cursor, undefined);
    const otherImage = answerValue(await handlers.listObjects({ image: "other" }, context));
    assert.deepEqual(otherImage.items.map((item) => item.name).sort(), another.map((o) => o.name).sort());
  });
});

describe("object operations - the typed stub", () => {
  type CounterShape = { inc(by?: number): Promise<number>; fail(): Promise<never>; slow(): Promise<void> };
  const base = () => url.replace(/\/2025-09-09\/objects$/, "");

  it("object operations - object(image, name) calls the object's methods with the caller's key", async () => {
    const counter = object<CounterShape>("counter", "stub / one", { url: base(), apiKey: bob.key });
    assert.equal(await counter.inc(4), 4);
    assert.equal(await counter.inc(), 5);
    assert.equal(activations.calls.at(-1), "bob/counter/stub / one/inc([])");
    // Awaiting the stub itself does not call a method named `then`.
    assert.equal(await Promise.resolve(counter).then(() => "not thenable"), "not thenable");
  });

  it("object operations - the stub rejects with what the method threw, and with the API's refusals", async () => {
    const counter = object<CounterShape>("counter", "stub two", { url: base(), apiKey: alice.key });
    const thrown = await counter.fail().catch((e: unknown) => e);
    assert.ok(isRpcError(thrown, "Teapot"), String(thrown));
    assert.equal(thrown.source, "rpc");
    assert.equal(thrown.status, 418);
    assert.equal(thrown.error.spout, 1);
    const busy = await counter.slow().catch((e: unknown) => e);
    assert.ok(isRpcError(busy, "ObjectBusy"), String(busy));
    assert.equal(busy.source, "api");
    assert.equal(busy.error.retryAfterSeconds, 2);
    const missing = await object<CounterShape>("nosuch", "x", { url: base(), apiKey: alice.key })
      .inc()
      .catch((e: unknown) => e);
    assert.ok(isRpcError(missing, "ImageNotFound"), String(missing));
    const unkeyed = await object<CounterShape>("counter", "x", { url: base(), apiKey: "" })
      .inc()
      .catch((e: unknown) => e);
    assert.ok(isRpcError(unkeyed, "Unauthorized"), String(unkeyed));
  });
});

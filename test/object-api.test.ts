// The object operations end to end: a real microVM host running objects in instances (its
// default provider), behind the microVM API with API keys. Calls through the typed stub, the
// directory's view of an active object (host, bytes, alarm), delete, and principals kept apart.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { httpClient } from "../client/index.ts";
import { newApiKey, parseApiKeys } from "../gateway/index.ts";
import { callObject, microvmApi, subscriptionSubject, viaGateway } from "../schemas/index.ts";
import { isRpcError, object, type ObjectShape } from "../vm-runtime/index.ts";
import { bundleImageModule } from "../vm-runtime/service/index.ts";
import type tallyImage from "./images/object-tally.ts";
import { lifo } from "./helpers/defer.ts";
import { startMicrovmService, type MicrovmService } from "./helpers/microvm.ts";
import { OBJECT_SETTLE_MS } from "./helpers/objects.ts";

const defer = lifo(after);
const alice = newApiKey("alice");
const bob = newApiKey("bob");
const keys = parseApiKeys(`${alice.line}\n${bob.line}\n`);
type Tally = ObjectShape<typeof tallyImage>;

/** A plain image (not an object): `defineImage` inlined as a bundler would. */
const plainImage =
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, ` +
  `fetch: () => new Response("no", { status: 404 }) });\n` +
  `export default defineImage({ methods: { hello: { handler: () => "hi" } } });\n`;

let svc: MicrovmService;
const tally = (name: string, key = alice.key) => object<Tally>("tally", name, { url: svc.microvmUrl, apiKey: key });
const objectsUrl = () => `${svc.microvmUrl}/2025-09-09/objects`;

type Answer = Record<string, unknown> & { items?: { name: string }[] };

/** A request to the object API as `key`'s principal: status and parsed body. */
async function http(method: string, path: string, key = alice.key) {
  const res = await fetch(`${objectsUrl()}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(method === "POST" ? { "content-type": "application/json" } : {}) },
  });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Answer) : undefined };
}

before(async () => {
  svc = await startMicrovmService(defer, { hostId: "objects-a" }, { apiKeys: keys });
  const module = await bundleImageModule(fileURLToPath(new URL("./images/object-tally.ts", import.meta.url)));
  for (const key of [alice.key, bob.key])
    await httpClient(microvmApi, svc.microvmUrl, { apiKey: key }).createImage({ name: "tally", module });
  await httpClient(microvmApi, svc.microvmUrl, { apiKey: alice.key }).createImage({
    name: "plain",
    module: plainImage,
  });
});

describe("object API", () => {
  it("object API - calls run the object's code; get and list show it active here, with its bytes and alarm", async () => {
    const counter = tally("seen");
    assert.equal(await counter.inc(2), 2);
    assert.equal(await counter.inc(), 3);
    const at = await counter.alarmIn(3_600_000);
    const got = await http("GET", "/tally/seen");
    assert.equal(got.status, 200, JSON.stringify(got.body));
    assert.deepEqual(got.body, {
      image: "tally",
      name: "seen",
      active: true,
      activeOn: svc.host.hostId,
      // The key "n" (token "bg") and the value 3.
      storageBytes: 3,
      alarmAt: at,
    });
    const listed = await http("GET", "?image=tally&limit=1000");
    assert.ok(
      (listed.body?.items ?? []).some((item) => item.name === "seen"),
      JSON.stringify(listed.body),
    );
  });

  it("object API - an unknown method is a 404 of the object's wire; a plain image NotAnObject; none ImageNotFound", async () => {
    const unknown = await http("POST", "/tally/wire/rpc/nosuch");
    assert.equal(unknown.status, 404, JSON.stringify(unknown.body));
    const plain = await object<{ hello(): Promise<string> }>("plain", "p", { url: svc.microvmUrl, apiKey: alice.key })
      .hello()
      .catch((e: unknown) => e);
    assert.ok(isRpcError(plain, "NotAnObject"), String(plain));
    assert.equal(plain.status, 400);
    const missing = await object<Tally>("nosuch", "m", { url: svc.microvmUrl, apiKey: alice.key })
      .inc()
      .catch((e: unknown) => e);
    assert.ok(isRpcError(missing, "ImageNotFound"), String(missing));
    assert.equal((await http("GET", "/plain/p")).status, 404);
  });

  it("object API - delete stops the activation, clears storage and alarm; the next call starts from nothing", async () => {
    const counter = tally("doomed");
    assert.equal(await counter.inc(5), 5);
    await counter.alarmIn(3_600_000);
    assert.equal((await http("DELETE", "/tally/doomed")).status, 204);
    const ref = { principal: "alice", image: "tally", name: "doomed" };
    assert.equal(await svc.host.objects.activeOn(ref), undefined);
    assert.equal((await http("GET", "/tally/doomed")).status, 404);
    assert.equal(await counter.inc(), 1);
    const again = await http("GET", "/tally/doomed");
    assert.equal(again.body?.alarmAt, undefined);
  });

  it("object API - another principal's object of the same image and name is another object, unseen", async () => {
    assert.equal(await tally("shared name").inc(7), 7);
    assert.equal(await tally("shared name", bob.key).inc(1), 1);
    assert.equal((await http("GET", "/tally/seen", bob.key)).status, 404);
    assert.equal((await http("DELETE", "/tally/seen", bob.key)).status, 404);
    const bobs = (await http("GET", "?limit=1000", bob.key)).body?.items ?? [];
    assert.deepEqual(
      bobs.map((item) => item.name),
      ["shared name"],
    );
    assert.equal(await tally("shared name").read(), 7);
  });

  it("object API - a call to an object active beside the gateway skips NATS, answered as one over NATS", async () => {
    const requests: string[] = [];
    const sub = svc.handle.nc.subscribe(subscriptionSubject(viaGateway(callObject)), {
      callback: (_err, msg) => {
        requests.push(msg.subject);
      },
    });
    defer(() => sub.unsubscribe());
    await svc.handle.nc.flush();
    const seenOverNats = async () => {
      await svc.handle.nc.flush();
      return requests.length;
    };
    // Active nowhere: over NATS, where any host may start it (here, the only one).
    assert.equal(await tally("beside").inc(1), 1);
    assert.equal(await seenOverNats(), 1);
    assert.equal(await tally("beside").inc(1), 2);
    const unknown = await http("POST", "/tally/beside/rpc/nosuch");
    assert.equal(await seenOverNats(), 1, "calls to an object active beside the gateway stay in this process");
    // The same calls through a gateway with no host beside it: over NATS, the same answers.
    const far = await svc.addGateway({});
    assert.equal(await object<Tally>("tally", "beside", { url: far, apiKey: alice.key }).inc(1), 3);
    const res = await fetch(`${far}/2025-09-09/objects/tally/beside/rpc/nosuch`, {
      method: "POST",
      headers: { authorization: `Bearer ${alice.key}`, "content-type": "application/json" },
    });
    assert.deepEqual({ status: res.status, body: await res.json() }, unknown);
    assert.equal(await seenOverNats(), 3);
  });

  it("object API - an object's output lines are its principal's, kept across its activations, gone with it", async () => {
    const talker = tally("talker");
    const ref = { principal: "alice", image: "tally", name: "talker" };
    type Lines = { items: { stream: string; line: string }[]; cursor: string };
    const lines = async (key = alice.key) => {
      const got = await http("GET", "/tally/talker/logs?limit=1000", key);
      return { status: got.status, body: got.body as unknown as Lines };
    };
    /** Waits (a long poll from the start of the object's lines) until `want` are all stored. */
    const stored = async (want: string[]) => {
      const deadline = Date.now() + OBJECT_SETTLE_MS;
      let cursor = "0";
      const seen: string[] = [];
      while (!want.every((line) => seen.includes(line))) {
        assert.ok(Date.now() < deadline, `lines ${JSON.stringify(want)} not stored; seen ${JSON.stringify(seen)}`);
        const page = await http("GET", `/tally/talker/logs?since=${cursor}&waitSeconds=5`);
        assert.equal(page.status, 200, JSON.stringify(page.body));
        const body = page.body as unknown as Lines;
        seen.push(...body.items.map((item) => `${item.stream} ${item.line}`));
        cursor = body.cursor;
      }
    };
    assert.equal((await lines()).status, 404, "no such object yet");
    assert.equal(await talker.say("first activation"), "first activation");
    await stored(["stdout first activation", "stderr err first activation"]);
    await svc.host.objects.deactivate(ref);
    assert.equal(await svc.host.objects.activeOn(ref), undefined);
    await talker.say("second activation");
    await stored(["stdout second activation"]);
    const all = await lines();
    assert.equal(all.status, 200);
    assert.deepEqual(
      all.body.items.filter((item) => item.stream === "stdout").map((item) => item.line),
      ["first activation", "second activation"],
      "one log for the object, across its activations",
    );
    const bobs = await lines(bob.key);
    assert.equal(bobs.status, 404, "another principal's object of that name is none of bob's");
    assert.equal((bobs.body as unknown as { _tag: string })._tag, "ObjectNotFound");
    assert.equal((await http("DELETE", "/tally/talker")).status, 204);
    assert.equal((await lines()).status, 404, "deleted with the object");
  });

  it("object API - 40 concurrent calls through two gateways and two hosts run one at a time on one activation", async () => {
    const second = await svc.addHost({ hostId: "objects-b" });
    const gateways = [svc.microvmUrl, await svc.addGateway({})];
    const crowd = (i: number) => object<Tally>("tally", "crowd", { url: gateways[i % 2]!, apiKey: alice.key });
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => crowd(i).inc(1)));
    assert.deepEqual(
      answers.map(Number).sort((x, y) => x - y),
      Array.from({ length: 40 }, (_, i) => i + 1),
      "each call saw the one before it: one at a time, on one storage",
    );
    const holding = [svc.host, second.host].filter((host) =>
      host.objects.activeHere().some((held) => held.name === "crowd" && held.principal === "alice"),
    );
    assert.equal(holding.length, 1, "one activation");
  });
});

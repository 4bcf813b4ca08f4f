// defineObject's checks, and an object image served by the runtime in-process: its readiness
// answer carries its traits (another image's does not), its alarm runs at /__object__/alarm
// (another image's fetch gets that path), and a method's storage call without a channel fails.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { defineImage } from "../vm-runtime/image.ts";
import { defineObject } from "../vm-runtime/object.ts";
import { createRuntimeServer } from "../vm-runtime/runtime/server.ts";
import type { Image } from "../vm-runtime/image.ts";

async function serve(t: TestContext, image: Image): Promise<string> {
  const server = createRuntimeServer(image, { log: () => {} });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

test("object definition - idle time and hibernation are checked, methods as an image's", () => {
  for (const idleSeconds of [0, 1.5, 86_401, Number.NaN])
    assert.throws(() => defineObject({ methods: {}, idleSeconds }), RangeError, String(idleSeconds));
  assert.throws(() => defineObject({ methods: {}, hibernate: "always" as "none" }), TypeError);
  assert.throws(() => defineObject({ methods: { constructor: { handler: () => 1 } } }), /reserved/);
  const object = defineObject({ methods: {}, idleSeconds: 86_400, hibernate: "snapshot" });
  assert.deepEqual(object.object, { idleSeconds: 86_400, hibernate: "snapshot", alarm: false });
  assert.equal(defineObject({ methods: {} }).object.idleSeconds, 60);
});

test("object definition - the runtime serves an object's traits, its alarm, and no storage without a channel", async (t) => {
  let alarms = 0;
  const object = defineObject({
    methods: { read: { handler: (ctx) => ctx.storage.get("k") }, name: { handler: (ctx) => ctx.name } },
    alarm: () => {
      alarms++;
    },
  });
  const base = await serve(t, object);
  const health = (await (await fetch(`${base}/__rpc__/`)).json()) as { object?: unknown };
  assert.deepEqual(health.object, { idleSeconds: 60, hibernate: "none", alarm: true });
  const alarm = await fetch(`${base}/__object__/alarm`, { method: "POST" });
  assert.equal(alarm.status, 200);
  assert.equal(await alarm.json(), null);
  assert.equal(alarms, 1);
  assert.equal((await fetch(`${base}/__object__/alarm`)).status, 405);
  const read = await fetch(`${base}/__rpc__/read`, { method: "POST", body: "[]" });
  assert.equal(read.status, 503);
  const body = (await read.json()) as { error: { _tag: string; message: string } };
  assert.equal(body.error._tag, "ObjectChannelClosed");
  assert.match(body.error.message, /no storage channel is open/);
  const name = await fetch(`${base}/__rpc__/name`, { method: "POST", body: "[]" });
  assert.equal(await name.json(), "", "no name before a channel names the object");
});

test("object definition - an object without an alarm answers 404; another image's fetch gets the path", async (t) => {
  const bare = await serve(t, defineObject({ methods: {} }));
  const none = await fetch(`${bare}/__object__/alarm`, { method: "POST" });
  assert.equal(none.status, 404);
  assert.equal(((await none.json()) as { error: { _tag: string } }).error._tag, "ObjectAlarmNotFound");
  const plain = await serve(
    t,
    defineImage({ methods: {}, fetch: (request) => new Response(new URL(request.url).pathname) }),
  );
  assert.equal(await (await fetch(`${plain}/__object__/alarm`, { method: "POST" })).text(), "/__object__/alarm");
  const health = (await (await fetch(`${plain}/__rpc__/`)).json()) as { object?: unknown };
  assert.equal(health.object, undefined);
});

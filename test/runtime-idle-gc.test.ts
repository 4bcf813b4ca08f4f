// The runtime's collection once idle: a memory-reducing GC after its requests end, with V8's
// gc() kept out of the image's global.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { once } from "node:events";
import { connect, type AddressInfo } from "node:net";
import { constants, PerformanceObserver } from "node:perf_hooks";
import type { Duplex } from "node:stream";
import { collectWhenIdle } from "../vm-runtime/runtime/idle-gc.ts";

/** What a `gc` performance entry tells of its collection. */
interface GcDetail {
  readonly kind: number;
  readonly flags: number;
}

/** Resolves with the first GC that collected all available garbage (V8's last-resort flavour). */
function lastResortGc(): Promise<GcDetail> {
  return new Promise((resolve) => {
    const observer = new PerformanceObserver((list) => {
      const details = list.getEntries().map((entry) => (entry as unknown as { detail: GcDetail }).detail);
      const found = details.find((gc) => (gc.flags & constants.NODE_PERFORMANCE_GC_FLAGS_ALL_AVAILABLE_GARBAGE) !== 0);
      if (!found) return;
      observer.disconnect();
      resolve(found);
    });
    observer.observe({ entryTypes: ["gc"] });
  });
}

test("idle gc - the heap is compacted once the server's requests have ended", async (t) => {
  const server = createServer((_req, res) => res.end("ok"));
  collectWhenIdle(server, 1);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => server.close());
  const collected = lastResortGc();
  const { port } = server.address() as AddressInfo;
  assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), "ok");
  assert.equal((await collected).kind, constants.NODE_PERFORMANCE_GC_MAJOR);
});

test("idle gc - image code never gets V8's gc()", () => {
  collectWhenIdle(createServer());
  assert.equal((globalThis as { gc?: unknown }).gc, undefined);
});

test("idle gc - an open object channel holds the collection off until it closes", async (t) => {
  const server = createServer((_req, res) => res.end("ok"));
  const channels: Duplex[] = [];
  server.on("upgrade", (_req, socket: Duplex) => {
    channels.push(socket.resume().once("end", () => socket.end()));
    socket.write("HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n");
  });
  let collections = 0;
  const collected = new Promise<void>((resolve) => {
    collectWhenIdle(server, 1, () => {
      collections++;
      resolve();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => server.close());
  const { port } = server.address() as AddressInfo;
  const client = connect(port, "127.0.0.1");
  client.write("GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n");
  await once(client, "data");
  assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), "ok");
  // Had the request's end armed the collection, its 1 ms timer would fire before this one.
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(collections, 0);
  client.destroy();
  await collected;
  assert.equal(collections, 1);
});

// The runtime's collection once idle: a memory-reducing GC after its requests end, with V8's
// gc() kept out of the image's global.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { constants, PerformanceObserver } from "node:perf_hooks";
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

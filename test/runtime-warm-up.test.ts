// The warm-up a wall booted ahead runs before it says it is up: the runtime's server for a
// stand-in image answers two requests on a socket of its own, then is gone, leaving nothing in
// the scratch directory (a launch snapshot of the wall cannot save a bound socket) and nothing
// listening; where it cannot listen, the wall comes up all the same.
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { chmodSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { warmRuntime } from "../vm-runtime/runtime/warm-up.ts";

const dirs: string[] = [];
const scratch = () => {
  const dir = mkdtempSync(join(tmpdir(), "warm-up-"));
  dirs.push(dir);
  return dir;
};
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe("runtime warm-up", () => {
  it("warm-up - answers its own two requests, then leaves no socket and nothing listening", async () => {
    const dir = scratch();
    const seen: string[] = [];
    // The requests it sends, as node's HTTP server reports each one it starts.
    const onStart = (message: unknown) => {
      const { request } = message as { request: { method?: string; url?: string } };
      seen.push(`${request.method} ${request.url}`);
    };
    subscribe("http.server.request.start", onStart);
    try {
      await warmRuntime(dir);
    } finally {
      unsubscribe("http.server.request.start", onStart);
    }
    assert.deepEqual(seen, ["GET /__rpc__/", "POST /__rpc__/echo"]);
    assert.deepEqual(readdirSync(dir), [], "no socket file left");
  });

  it("warm-up - where it cannot listen it resolves all the same (the wall comes up without it)", async (t) => {
    if (process.getuid?.() === 0) {
      // Root writes through a read-only mode: a path too long for a socket fails the listen instead.
      await assert.doesNotReject(warmRuntime(join(scratch(), "x".repeat(120))));
      return;
    }
    const dir = scratch();
    chmodSync(dir, 0o500);
    t.after(() => chmodSync(dir, 0o700));
    await assert.doesNotReject(warmRuntime(dir));
    assert.deepEqual(readdirSync(dir), []);
  });
});

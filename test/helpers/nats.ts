// Test NATS: `NATS_URL` when set, else a private `nats-server -js` on a free port with a
// temporary store (testcontainers takes over only where a Docker engine is reachable).
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startNatsServer, type NatsServer } from "../../platform/index.ts";
import type { Defer } from "./defer.ts";

export interface TestNats {
  url: string;
  /** The private server, when the test owns one (restart tests need it). */
  server?: NatsServer;
  storeDir?: string;
}

/** A NATS for a test file; `private` forces an own server (to stop or restart it). */
export async function testNats(defer: Defer, { private: own = false } = {}): Promise<TestNats> {
  if (process.env.NATS_URL && !own) return { url: process.env.NATS_URL };
  const storeDir = await mkdtemp(join(tmpdir(), "nats-test-"));
  const server = await startNatsServer({ storeDir });
  defer(async () => {
    await server.stop();
    await rm(storeDir, { recursive: true, force: true });
  });
  return { url: server.url, server, storeDir };
}

// Where the tests' NATS comes from: NATS_URL, else a local nats-server, else testcontainers
// where a Docker engine answers, else an error naming the three. (A container itself needs a
// Docker engine, which these machines lack; the choice is what is tested here.)
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:http";
import { once } from "node:events";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { lifo } from "./helpers/defer.ts";
import { natsSource, skipUnlessRestartable } from "./helpers/nats.ts";

const withNatsServer = {
  PATH: process.env.PATH ?? "",
  HOME: "/nonexistent",
  DOCKER_HOST: "unix:///nonexistent/docker.sock",
};
const withNothing = { ...withNatsServer, PATH: "/nonexistent" };
/** No local binary at all (the project's `.tools/` and /usr/sbin are looked at too). */
const noBinary = { findBinary: () => undefined };

/** A stand-in Docker engine on a unix socket: answers `GET /_ping` with OK, as dockerd does. */
async function fakeDockerEngine(defer: (fn: () => unknown) => void): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "fake-docker-"));
  const socket = join(dir, "docker.sock");
  const server = createServer((req, res) => res.writeHead(req.url === "/_ping" ? 200 : 404).end("OK"));
  server.listen(socket);
  await once(server, "listening");
  defer(() => rm(dir, { recursive: true, force: true }));
  defer(() => new Promise((r) => server.close(r)));
  return `unix://${socket}`;
}

describe("test NATS", () => {
  it("test NATS - NATS_URL comes first, except for a private server", async () => {
    const env = { ...withNatsServer, NATS_URL: "nats://127.0.0.1:4222" };
    assert.equal(await natsSource({ env }), "env");
    assert.equal(await natsSource({ env, private: true }), "local");
  });

  it("test NATS - a local nats-server comes before a Docker engine", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const DOCKER_HOST = await fakeDockerEngine(defer);
    assert.equal(await natsSource({ env: { ...withNatsServer, DOCKER_HOST } }), "local");
    assert.equal(await natsSource({ env: { ...withNothing, DOCKER_HOST }, ...noBinary }), "testcontainers");
  });

  it("test NATS - with neither NATS_URL, nor nats-server, nor a Docker engine, the error names all three", async () => {
    await assert.rejects(natsSource({ env: withNothing, ...noBinary }), (err: Error) => {
      assert.match(err.message, /set NATS_URL/);
      assert.match(err.message, /get nats-server >= 2\.12 \(scripts\/get-nats-server\.sh\)/);
      assert.match(
        err.message,
        /start a Docker engine for testcontainers \(none answered at unix:\/\/\/nonexistent\/docker\.sock\)/,
      );
      return true;
    });
  });

  it("test NATS - a test that restarts NATS is skipped, with its reason, where only testcontainers is there", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    const DOCKER_HOST = await fakeDockerEngine(defer);
    const skipped: (string | undefined)[] = [];
    const fake = { name: "restarts NATS", skip: (reason?: string) => void skipped.push(reason) };
    assert.equal(await skipUnlessRestartable(fake, { ...withNatsServer, DOCKER_HOST }), false);
    assert.equal(await skipUnlessRestartable(fake, { ...withNothing, DOCKER_HOST }, noBinary.findBinary), true);
    assert.deepEqual(skipped, ["needs a local nats-server to restart NATS (only testcontainers is available here)"]);
  });
});

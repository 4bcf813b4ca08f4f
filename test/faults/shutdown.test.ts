// Graceful shutdown: on SIGTERM the gateway stops being ready, refuses new connections,
// lets requests in flight finish with their answer, then exits 0.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { lifo } from "../helpers/defer.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";

/** A createTask whose body trickles in over `ms`, so it is in flight for that long. */
function slowCreate(url: string, ms: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode!, body }));
    });
    req.on("error", reject);
    const parts = ['{"title":', '"slow', " but", ' sure"', "}"];
    for (const [i, part] of parts.entries()) {
      setTimeout(() => (i === parts.length - 1 ? req.end(part) : req.write(part)), (ms / parts.length) * i);
    }
  });
}

describe("faults: graceful shutdown", () => {
  it("shutdown - SIGTERM lets requests in flight finish, refuses new ones, exits 0", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    const svc = await startServiceProcess(nats.env());
    defer(() => svc.stop("SIGKILL"));
    assert.equal((await fetch(`${svc.taskUrl}/readyz`)).status, 200);
    assert.equal((await fetch(`${svc.taskUrl}/livez`)).status, 200);

    const inFlight = Array.from({ length: 10 }, () => slowCreate(`${svc.taskUrl}/`, 1_000));
    await new Promise((r) => setTimeout(r, 300));
    const exit = svc.stop("SIGTERM");
    await new Promise((r) => setTimeout(r, 100));
    await assert.rejects(fetch(`${svc.taskUrl}/readyz`), "new connections are refused");

    const answers = await Promise.all(inFlight);
    for (const answer of answers) {
      assert.equal(answer.status, 200);
      assert.equal((JSON.parse(answer.body) as { title: string }).title, "slow but sure");
    }
    assert.equal(await exit, 0);
  });
});

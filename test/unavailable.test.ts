// What the gateway answers when actors are missing, slow, failing, or NATS is gone.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { gatewayDispatch, serveOperation } from "../actors/index.ts";
import { createGateways } from "../gateway/index.ts";
import { connectNats, recordStores, startNatsServer } from "../platform/index.ts";
import { createJob, getTask, subscriptionSubject, viaGateway } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { skipUnlessRestartable, testNats } from "./helpers/nats.ts";
import { getJson, postJson, startService } from "./helpers/service.ts";

describe("unavailable", () => {
  it("unavailable - no actors answering is 503 with Retry-After, after about a second of retries", async (t) => {
    const svc = await startService(
      lifo((fn) => t.after(fn)),
      // A request timeout far above the second of retries: a 503 that waited for it shows.
      { actors: false, requestTimeoutMs: 20_000 },
    );
    const started = Date.now();
    const res = await postJson(`${svc.taskUrl}/`, { title: "t" });
    const elapsed = Date.now() - started;
    assert.equal(res.status, 503);
    assert.deepEqual(res.body, {
      _tag: "ServiceUnavailable",
      message: "the service's actors cannot be reached at the moment: retry after the Retry-After seconds",
    });
    assert.equal(res.headers.get("retry-after"), "1");
    // About a second of retries (plus the machine's delays), never the request's 20 s.
    console.log(`# no responders: 503 after ${elapsed} ms`);
    assert.ok(elapsed < 10_000, `answered in ${elapsed} ms, not after the retries but near the 20 s request timeout`);
  });

  it("unavailable - an actor that never answers is 504 GatewayTimeout", async (t) => {
    const svc = await startService(
      lifo((fn) => t.after(fn)),
      { actors: false, requestTimeoutMs: 300, localReads: false },
    );
    // On the subjects the gateway sends on: its copies.
    const silent = svc.handle.nc.subscribe(subscriptionSubject(viaGateway(getTask)), { callback: () => {} });
    const silentCreate = svc.handle.nc.subscribe(subscriptionSubject(viaGateway(createJob)), { callback: () => {} });
    t.after(() => silent.unsubscribe());
    t.after(() => silentCreate.unsubscribe());
    await svc.handle.nc.flush(); // subscribed at the server before the gateway (another connection) sends
    const res = await getJson(`${svc.taskUrl}/some-id`);
    assert.equal(res.status, 504);
    assert.deepEqual(res.body, {
      _tag: "GatewayTimeout",
      message: "the service's actors did not answer in time: the outcome is unknown (a write may have been done)",
    });
    const create = await postJson(`${svc.jobUrl}/`, { content: "c" });
    assert.equal(create.status, 504);
  });

  it("unavailable - an undeclared failure is a bare 500 without stack or cause", async (t) => {
    const svc = await startService(
      lifo((fn) => t.after(fn)),
      { actors: false, localReads: false },
    );
    const sub = serveOperation(
      svc.handle.nc,
      viaGateway(getTask),
      async () => {
        throw new Error("db password is hunter2");
      },
      { prefix: "", queue: "q" },
    );
    t.after(() => sub.unsubscribe());
    const res = await fetch(`${svc.taskUrl}/x`);
    const text = await res.text();
    assert.equal(res.status, 500);
    assert.equal(
      text,
      `{"_tag":"InternalServerError","message":"internal error: the service's log has the cause (look for this ` +
        `response's X-Request-Id)"}`,
    );
  });

  it("unavailable - NATS down is 503 at once; the gateway recovers when it returns", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    const handle = await connectNats({ ...nats.login("gateway"), name: "gw" });
    defer(() => handle.close());
    const gateways = createGateways({ nats: handle, ...gatewayDispatch(recordStores(handle.requester)) });
    const port = await gateways.task.listen(0, "127.0.0.1");
    defer(() => gateways.task.close());
    // Actors in their own connection, as in a separate process.
    const { startActors } = await import("../actors/index.ts");
    const { actorBuckets, provisionBuckets } = await import("../platform/index.ts");
    const provision = await connectNats({ ...nats.login("provision"), name: "provision" });
    await provisionBuckets(provision.nc, { only: actorBuckets });
    await provision.close();
    const actorConn = await connectNats({ ...nats.login("actors"), name: "actors" });
    defer(() => actorConn.close());
    const actors = startActors(actorConn.nc, recordStores(actorConn.requester));
    defer(() => actors.close());
    await actorConn.nc.flush(); // the actors' subscriptions are known to the server before any request

    const created = await postJson(`http://127.0.0.1:${port}/`, { title: "before outage" });
    assert.equal(created.status, 200);
    await nats.server!.stop();
    await new Promise((r) => setTimeout(r, 200));
    const started = Date.now();
    const during = await postJson(`http://127.0.0.1:${port}/`, { title: "during" });
    assert.equal(during.status, 503);
    assert.equal(during.headers.get("retry-after"), "1");
    const readDuring = await getJson(`http://127.0.0.1:${port}/00000000-0000-4000-8000-000000000000`);
    assert.equal(readDuring.status, 503, "a read with NATS down is 503, not a 404");
    assert.ok(Date.now() - started < 1_000, "answered within a second");

    const restarted = await startNatsServer({
      storeDir: nats.storeDir!,
      port: nats.server!.port,
      authorization: nats.authorization,
    });
    defer(() => restarted.stop());
    const back = Date.now();
    let after = during;
    while (after.status !== 200 && Date.now() - back < 10_000) {
      await new Promise((r) => setTimeout(r, 100));
      after = await postJson(`http://127.0.0.1:${port}/`, { title: "after" });
    }
    assert.equal(after.status, 200, "recovered without a restart");
    const id = (created.body as { id: string }).id;
    assert.deepEqual((await getJson(`http://127.0.0.1:${port}/${id}`)).body, created.body);
  });
});

// Held requests (platform/held-requests.ts) against a real NATS, each half alone: the gateway
// gives up a long poll whose HTTP client left and publishes its id on the cancel subject (a
// stand-in responder that never answers, so only the gateway can release it); a host's wait
// ends at its cancel, also at one that arrived before the wait began.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { headers as natsHeaders, type Msg } from "@nats-io/transport-node";
import { createGateways } from "../gateway/index.ts";
import {
  connectNats,
  HELD_REQUEST_HEADER,
  HeldRequests,
  heldCancelSubject,
  type NatsHandle,
} from "../platform/index.ts";
import { getMicrovmLogs, subscriptionSubject, viaGateway } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";

const defer = lifo(after);
let nats: TestNats;
let admin: NatsHandle;

before(async () => {
  nats = await testNats(defer);
  admin = await connectNats({ ...nats.login("admin"), name: "test:admin" });
  defer(() => admin.close());
});

/** The next message on `subject` (subscribed before it resolves to the caller). */
async function nextOn(handle: NatsHandle, subject: string): Promise<() => Promise<Msg>> {
  const sub = handle.nc.subscribe(subject, { max: 1 });
  await handle.nc.flush();
  return async () => {
    for await (const msg of sub) return msg;
    throw new Error(`no message on ${subject}`);
  };
}

describe("held requests", () => {
  it("held requests - the gateway gives up a long poll whose client left, and names it on the cancel subject", async () => {
    const gatewayNats = await connectNats({ ...nats.login("gateway"), name: "test:gateway" });
    defer(() => gatewayNats.close());
    const gateway = createGateways({ nats: gatewayNats, requestTimeoutMs: 5_000 }).microvm;
    const url = `http://127.0.0.1:${await gateway.listen(0, "127.0.0.1")}`;
    defer(() => gateway.close());
    // A responder that takes the request and never answers: only the gateway can let it go.
    const request = await nextOn(admin, subscriptionSubject(viaGateway(getMicrovmLogs)));
    const cancel = await nextOn(admin, heldCancelSubject());
    const aborter = new AbortController();
    const polling = fetch(`${url}/2025-09-09/microvms/vm-1/logs?since=0&waitSeconds=30`, { signal: aborter.signal });
    const received = await request();
    const id = received.headers?.get(HELD_REQUEST_HEADER);
    assert.ok(id, "the request carries its hold id");
    assert.equal(gatewayNats.requester.waiting, 1, "the gateway waits for its answer");
    const left = Date.now();
    aborter.abort();
    await polling.catch(() => undefined);
    assert.equal((await cancel()).string(), id, "the cancel names the request");
    // Released by the abort itself, not by its timeout (30 s of wait and 5 s of answer later).
    while (gatewayNats.requester.waiting > 0) {
      assert.ok(Date.now() - left < 30_000, "the gateway still waits for the request its client left");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  });

  it("held requests - a host's wait ends at its cancel, also one that came before the wait began", async () => {
    const hostNats = await connectNats({ ...nats.login("microvms"), name: "test:host" });
    defer(() => hostNats.close());
    const held = new HeldRequests(hostNats.nc);
    defer(() => held.close());
    await hostNats.nc.flush();
    const headersOf = (id: string) => {
      const h = natsHeaders();
      h.set(HELD_REQUEST_HEADER, id);
      return h;
    };
    // Heard by the host when this resolves: the server sent the cancel before the host's PONG.
    const cancel = async (id: string) => {
      admin.nc.publish(heldCancelSubject(), id);
      await admin.nc.flush();
      await hostNats.nc.flush();
    };
    // Cancelled while held: the work sees its signal abort.
    let started!: () => void;
    const waiting = new Promise<void>((resolve) => (started = resolve));
    const ended = held.hold(headersOf("wait-1"), (signal) => {
      started();
      return new Promise<string>((resolve) => signal!.addEventListener("abort", () => resolve("aborted")));
    });
    await waiting;
    await cancel("wait-1");
    assert.equal(await ended, "aborted");
    // Cancelled first (the request was still being checked): the wait begins aborted.
    await cancel("wait-2");
    assert.equal(await held.hold(headersOf("wait-2"), async (signal) => signal?.aborted), true);
    // A request without an id (a NATS caller) gets no signal.
    assert.equal(await held.hold(undefined, async (signal) => signal), undefined);
  });
});

// Direct gets gathered per event-loop turn (platform/record-store.ts `directGets`), against a
// real nats-server: the keys read in one turn go out as one batch request and answer exactly
// what reads one at a time answer (found, deleted, never written, the same key twice); a batch
// where nothing is found; a stream without direct gets; and a batch answer cut short (the test
// answering for a stream of its own) asks the keys it did not cover one by one.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { connectNats, directGets, DIRECT_BATCH_MAX, recordStore, type NatsHandle } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);
let client: NatsHandle;
let observer: NatsHandle;

before(async () => {
  const nats = await testNats(defer, { private: true });
  client = await connectNats({ ...nats.login("admin"), name: "test:direct-gets" });
  defer(() => client.close());
  observer = await connectNats({ ...nats.login("admin"), name: "test:direct-gets-observer" });
  defer(() => observer.close());
});

/** Counts the direct-get requests of `stream` (the observer only listens; the server answers). */
async function counted(nc: NatsConnection, stream: string) {
  const counts = { single: 0, batch: 0 };
  const subs: Subscription[] = [
    nc.subscribe(`$JS.API.DIRECT.GET.${stream}`, {
      callback: () => {
        counts.batch++;
      },
    }),
    nc.subscribe(`$JS.API.DIRECT.GET.${stream}.>`, {
      callback: () => {
        counts.single++;
      },
    }),
  ];
  await nc.flush();
  defer(() => {
    for (const sub of subs) sub.unsubscribe();
  });
  return counts;
}

describe("direct gets", () => {
  it("direct gets - the keys read in one turn share one request per 256 and answer as reads one at a time do", async () => {
    const kv = await new Kvm(client.nc).create("dgmix", { history: 1, allow_direct: true });
    const written = Array.from({ length: 200 }, (_, i) => `k${i}`);
    for (const key of written) await kv.put(key, `value of ${key}`);
    for (const key of written.slice(0, 40)) await kv.delete(key);
    // Found, deleted, never written, and one key asked twice: 301 reads of 300 keys.
    const keys = [...written, ...Array.from({ length: 100 }, (_, i) => `none${i}`), "k150"];
    const store = recordStore(client.requester, "dgmix");
    const counts = await counted(observer.nc, "KV_dgmix");

    const together = await Promise.all(keys.map((key) => store.lastWrite(key)));
    const values = await Promise.all(keys.map((key) => store.get(key)));
    await observer.nc.flush();
    const batched = { ...counts };
    const alone: unknown[] = [];
    for (const key of keys) alone.push(await store.lastWrite(key));
    await observer.nc.flush();

    assert.deepEqual(together, alone);
    assert.equal(together.filter((last) => last === undefined).length, 100, "100 keys were never written");
    assert.equal(together.filter((last) => last?.deleted).length, 40, "40 were deleted");
    assert.equal(new TextDecoder().decode(values[150]), "value of k150");
    assert.equal(new TextDecoder().decode(values[300]), "value of k150", "the key asked twice");
    assert.equal(values[0], undefined, "a deleted key has no value");
    // 300 distinct keys a turn: two batches of at most 256 each, twice; one request a key alone.
    const perTurn = Math.ceil(300 / DIRECT_BATCH_MAX);
    assert.deepEqual(batched, { single: 0, batch: 2 * perTurn });
    assert.deepEqual({ ...counts }, { single: keys.length, batch: 2 * perTurn });
  });

  it("direct gets - a turn whose keys were never written is one request answered 404", async () => {
    await new Kvm(client.nc).create("dgnone", { history: 1, allow_direct: true });
    const store = recordStore(client.requester, "dgnone");
    const counts = await counted(observer.nc, "KV_dgnone");
    const found = await Promise.all(["a", "b", "c"].map((key) => store.entry(key)));
    await observer.nc.flush();
    assert.deepEqual(found, [undefined, undefined, undefined]);
    assert.deepEqual({ ...counts }, { single: 0, batch: 1 });
  });

  it("direct gets - a stream without direct gets still answers a turn's reads (the leader's get)", async () => {
    const kv = await new Kvm(client.nc).create("dgoff", { history: 1, allow_direct: false });
    await kv.put("there", "yes");
    const store = recordStore(client.requester, "dgoff");
    const [there, absent] = await Promise.all([store.get("there"), store.get("absent")]);
    assert.equal(new TextDecoder().decode(there), "yes");
    assert.equal(absent, undefined);
  });

  it("direct gets - a batch answer cut short: the keys it did not cover are asked one by one", async () => {
    // The test answers for stream FAKE: a batch gets one message and an end with one pending.
    const asked: string[] = [];
    const reply = (msg: Msg, code: number, subject?: string) => {
      const h = headers(code, code === 204 ? "EOB" : code === 404 ? "Message Not Found" : "");
      if (subject) h.set("Nats-Subject", subject);
      if (code === 204) h.set("Nats-Num-Pending", "1");
      msg.respond(subject ? `value of ${subject}` : undefined, { headers: h });
    };
    const subs = [
      observer.nc.subscribe("$JS.API.DIRECT.GET.FAKE", {
        callback: (_err, msg) => {
          asked.push(`batch ${msg.json<{ multi_last: string[] }>().multi_last.join(",")}`);
          reply(msg, 0, "s.a");
          reply(msg, 204);
        },
      }),
      observer.nc.subscribe("$JS.API.DIRECT.GET.FAKE.>", {
        callback: (_err, msg) => {
          const subject = msg.subject.slice("$JS.API.DIRECT.GET.FAKE.".length);
          asked.push(subject);
          if (subject === "s.b") reply(msg, 0, "s.b");
          else reply(msg, 404);
        },
      }),
    ];
    defer(() => {
      for (const sub of subs) sub.unsubscribe();
    });
    await observer.nc.flush();
    const get = directGets(client.requester, "FAKE", 5_000);
    const answers = await Promise.all(["s.a", "s.b", "s.c"].map(get));
    assert.deepEqual(
      answers.map((msg) => msg && new TextDecoder().decode(msg.data)),
      ["value of s.a", "value of s.b", undefined],
    );
    assert.deepEqual(asked.sort(), ["batch s.a,s.b,s.c", "s.b", "s.c"]);
  });
});

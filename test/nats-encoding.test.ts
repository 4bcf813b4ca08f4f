// nats.js' text encoding as the service sets it (platform/nats-encoding.ts): short strings go
// into pooled buffers, and every string encodes to the bytes TextEncoder gives (multi-byte
// characters, lone surrogates, the empty string, long strings); through a real nats-server, a
// request's subject, headers and payload arrive as sent.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { headers, type Msg } from "@nats-io/transport-node";
import { TE } from "@nats-io/nats-core/internal";
import { connectNats, poolNatsEncoding, type NatsHandle } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);
const reference = new TextEncoder();

const samples = [
  "",
  "PUB tasks.create _INBOX_gateway.x.1 42\r\n",
  '{"id":"0b0e9f6c","title":"été 漢字 🙂","completed":false}',
  "lone \ud800 high, lone \udc00 low, reversed \udc00\ud800",
  "x".repeat(4095),
  "y".repeat(4096),
  `${"ü".repeat(3000)}z`,
];

describe("nats.js text encoding", () => {
  before(() => poolNatsEncoding());

  it("gives TextEncoder's bytes for every string", () => {
    for (const sample of samples) {
      assert.deepEqual(
        Buffer.from(TE.encode(sample)),
        Buffer.from(reference.encode(sample)),
        `${sample.slice(0, 20)}… (${sample.length})`,
      );
    }
    assert.equal(TE.encode().length, 0);
  });

  it("takes short strings from the buffer pool, long ones as TextEncoder does", () => {
    assert.ok(Buffer.isBuffer(TE.encode("HPUB a b 1 2\r\n")), "a protocol line is a pooled buffer");
    assert.ok(!Buffer.isBuffer(TE.encode("y".repeat(4096))), "a long string is encoded apart");
  });

  describe("through nats-server", () => {
    let client: NatsHandle;
    let peer: NatsHandle;

    before(async () => {
      const nats = await testNats(defer);
      client = await connectNats({ ...nats.login("admin"), name: "test:nats-encoding" });
      defer(() => client.close());
      peer = await connectNats({ ...nats.login("admin"), name: "test:nats-encoding-peer" });
      defer(() => peer.close());
    });

    it("delivers a request's headers and payload as sent, and its reply", async () => {
      const subject = `test.encoding.${process.pid}`;
      const received: Msg[] = [];
      const sub = peer.nc.subscribe(subject, {
        callback: (_err, msg) => {
          received.push(msg);
          const h = headers();
          h.set("Answer-Of", msg.headers?.get("Request-Id") ?? "none");
          msg.respond(`réponse à ${msg.string()}`, { headers: h });
        },
      });
      defer(() => sub.unsubscribe());
      await peer.nc.flush();
      for (const sample of samples) {
        const h = headers();
        h.set("Request-Id", `id-ü-${sample.length}`);
        const reply = await client.requester.request(subject, sample, 5_000, h);
        const got = received.at(-1)!;
        assert.deepEqual(Buffer.from(got.data), Buffer.from(reference.encode(sample)));
        assert.equal(got.headers?.get("Request-Id"), `id-ü-${sample.length}`);
        assert.equal(reply.string(), `réponse à ${new TextDecoder().decode(reference.encode(sample))}`);
        assert.equal(reply.headers?.get("Answer-Of"), `id-ü-${sample.length}`);
      }
      assert.equal(received.length, samples.length);
    });
  });
});

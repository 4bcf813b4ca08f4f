// Reading a received message's headers from its raw block (platform/raw-headers.ts): the same
// values nats.js decodes, on messages a real nats-server delivered, including the headers the
// server adds (a KV write's change notice) and a status-only reply.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { headers, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connectNats, headerIn, leanReply, rawHeaders, type NatsHandle } from "../platform/index.ts";
import { replyOf } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);
let handle: NatsHandle;

before(async () => {
  const nats = await testNats(defer);
  handle = await connectNats({ ...nats.login("admin"), name: "raw-headers-test" });
  defer(() => handle.close());
});

/** The next `count` messages on `subject`, once all have arrived (subscribed from now on). */
function arriving(nc: NatsConnection, subject: string, count: number): Promise<Msg[]> {
  const messages: Msg[] = [];
  return new Promise((resolve) => {
    nc.subscribe(subject, {
      max: count,
      callback: (_err, msg) => {
        if (messages.push(msg) === count) resolve(messages);
      },
    });
  });
}

describe("raw headers", () => {
  it("raw headers - every value nats.js decodes is read alike from the raw block, on real messages", async () => {
    const { nc } = handle;
    const arrived = arriving(nc, "raw.>", 2);
    const h = headers();
    h.set("Revision", "17");
    h.set("Record", "tasks.0b1c2d3e-aaaa-4bbb-8ccc-123456789abc");
    h.append("Twice", "first");
    h.append("Twice", "second");
    h.set("Spaced", "  padded value  ");
    h.set("Unicode", "naïve ✓");
    nc.publish("raw.with", "body", { headers: h });
    nc.publish("raw.without", "body");
    const [withHeaders, withoutHeaders] = await arrived;
    assert.ok(withHeaders && withoutHeaders, "both messages arrived");

    const raw = rawHeaders(withHeaders)!;
    assert.notEqual(raw, withHeaders.headers, "read from the raw block (nats.js keeps one), not decoded");
    for (const name of ["Revision", "Record", "Twice", "Spaced", "Unicode", "Absent"])
      assert.equal(raw.get(name), withHeaders.headers!.get(name), name);
    assert.equal(raw.get("Twice"), "first");
    assert.equal(raw.get("Spaced"), "padded value");
    assert.equal(rawHeaders(withoutHeaders), undefined);
    assert.equal(withHeaders.string(), "body", "the body is untouched");

    // A reply with the error code header, and one with the stored record's, decode alike either way.
    const error = headers();
    error.set("Nats-Service-Error-Code", "404");
    const replies: Msg[] = [];
    const echo = nc.subscribe("raw.reply", {
      callback: (_err, msg) => {
        msg.respond(msg.data, { headers: msg.string() === "error" ? error : h });
      },
    });
    for (const body of ["error", "stored"]) replies.push(await nc.request("raw.reply", body));
    echo.unsubscribe();
    for (const reply of replies) assert.deepEqual(replyOf(leanReply(reply)), replyOf(reply));
    assert.equal(replyOf(leanReply(replies[0]!)).status, 404);
    assert.deepEqual(replyOf(leanReply(replies[1]!)).stored, {
      record: "tasks.0b1c2d3e-aaaa-4bbb-8ccc-123456789abc",
      revision: 17,
    });
  });

  it("raw headers - a change notice the server republishes and a no-responders status read as nats.js decodes them", async () => {
    const { nc } = handle;
    const stream = `RAW_HEADERS_${process.pid}`;
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({
      name: stream,
      subjects: [`rawkv${process.pid}.>`],
      storage: StorageType.Memory,
      republish: { src: `rawkv${process.pid}.>`, dest: `rawchanged${process.pid}.>`, headers_only: true },
    });
    defer(() => jsm.streams.delete(stream));

    const noticed = arriving(nc, `rawchanged${process.pid}.>`, 2);
    await nc.flush();
    for (const key of ["a", "b"]) {
      const h = headers();
      h.set("Nats-Expected-Last-Subject-Sequence", "0");
      h.set("Request-Id", `write-${key}`);
      const ack = await nc.request(`rawkv${process.pid}.${key}`, `{"key":"${key}"}`, { headers: h, timeout: 5_000 });
      assert.equal(ack.json<{ error?: unknown }>().error, undefined);
    }
    for (const [i, notice] of (await noticed).entries()) {
      const raw = rawHeaders(notice)!;
      assert.notEqual(raw, notice.headers, "read from the raw block");
      for (const name of [
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Last-Sequence",
        "Nats-Msg-Size",
        "Request-Id",
      ])
        assert.equal(raw.get(name), notice.headers!.get(name), name);
      assert.equal(raw.get("Nats-Sequence"), String(i + 1));
    }

    // Nobody subscribes: the server answers the inbox with a status line and no header.
    const inbox = `raw.inbox.${process.pid}`;
    const status = arriving(nc, inbox, 1);
    nc.publish(`raw.nobody.${process.pid}`, "", { reply: inbox, headers: headers() });
    const [noResponders] = await status;
    assert.equal(noResponders.headers?.code, 503, "the server's no-responders status");
    assert.deepEqual(replyOf(leanReply(noResponders)), replyOf(noResponders));
  });

  it("raw headers - a header block is searched by exact name, line by line", () => {
    const block = "NATS/1.0\r\nNats-Stream: KV_tasks\r\nNats-Sequence: 42\r\nNats-Sequence-Other: 7\r\nLast: x";
    assert.equal(headerIn(block, "Nats-Sequence"), "42");
    assert.equal(headerIn(block, "Nats-Stream"), "KV_tasks");
    assert.equal(headerIn(block, "Last"), "x", "the last line needs no line end");
    assert.equal(headerIn(block, "Sequence"), "", "a name is matched from the start of a line");
    assert.equal(headerIn(block, "NATS/1.0"), "", "the status line is no header");
  });
});

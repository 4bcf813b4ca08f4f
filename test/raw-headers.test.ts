// Reading a received message's headers from its raw block (platform/raw-headers.ts): the same
// values nats.js decodes, on messages a real nats-server delivered, including the headers the
// server adds (a KV write's change notice) and a status-only reply.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { headers, type Msg } from "@nats-io/transport-node";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connectNats, headerIn, leanReply, rawHeaders } from "../platform/index.ts";
import { replyOf } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

describe("raw headers", () => {
  it("raw headers - every value nats.js decodes is read alike from the raw block, on real messages", async (t) => {
    const defer = lifo((hook) => t.after(hook));
    const nats = await testNats(defer);
    const handle = await connectNats({ ...nats.login("admin"), name: "raw-headers-test" });
    defer(() => handle.close());
    const { nc } = handle;
    const received: Msg[] = [];
    let bothArrived!: () => void;
    const arrived = new Promise<void>((resolve) => (bothArrived = resolve));
    const sub = nc.subscribe("raw.>", {
      callback: (_err, msg) => {
        if (received.push(msg) === 2) bothArrived();
      },
    });
    const h = headers();
    h.set("Revision", "17");
    h.set("Record", "tasks.0b1c2d3e-aaaa-4bbb-8ccc-123456789abc");
    h.append("Twice", "first");
    h.append("Twice", "second");
    h.set("Spaced", "  padded value  ");
    h.set("Unicode", "naïve ✓");
    nc.publish("raw.with", "body", { headers: h });
    nc.publish("raw.without", "body");
    await nc.flush();
    await arrived;
    sub.unsubscribe();
    const [withHeaders, withoutHeaders] = received;
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

  it("raw headers - a change notice the server republishes and a no-responders status read as nats.js decodes them", async (t) => {
    const defer = lifo((hook) => t.after(hook));
    const nats = await testNats(defer);
    const handle = await connectNats({ ...nats.login("admin"), name: "raw-headers-server-test" });
    defer(() => handle.close());
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

    const notices: Msg[] = [];
    let noticed!: () => void;
    const allNoticed = new Promise<void>((resolve) => (noticed = resolve));
    const feed = nc.subscribe(`rawchanged${process.pid}.>`, {
      callback: (_err, msg) => {
        if (notices.push(msg) === 2) noticed();
      },
    });
    defer(() => feed.unsubscribe());
    await nc.flush();
    for (const key of ["a", "b"]) {
      const h = headers();
      h.set("Nats-Expected-Last-Subject-Sequence", "0");
      h.set("Request-Id", `write-${key}`);
      const ack = await nc.request(`rawkv${process.pid}.${key}`, `{"key":"${key}"}`, { headers: h, timeout: 5_000 });
      assert.equal(ack.json<{ error?: unknown }>().error, undefined);
    }
    await allNoticed;
    for (const [i, notice] of notices.entries()) {
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
    const status = new Promise<Msg>((resolve) => {
      const sub = nc.subscribe(inbox, { max: 1, callback: (_err, msg) => resolve(msg) });
      defer(() => sub.unsubscribe());
    });
    nc.publish(`raw.nobody.${process.pid}`, "", { reply: inbox, headers: headers() });
    const noResponders = await status;
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

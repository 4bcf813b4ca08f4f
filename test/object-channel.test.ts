// The host's side of the object channel against a hostile runtime: a fake runtime on a unix
// socket answers the readiness probe as an object and then writes raw bytes on the channel.
// Garbage and over-long lines close the channel, requests past the in-flight bound are
// answered with an error, unknown operations and bad fields are answered, a runtime that does
// not read its answers is not read either, answers of calls are bounded, and the host goes on.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  ObjectError,
  openObjectSession,
  type ObjectAlarms,
  type ObjectSession,
  type ObjectStorage,
} from "../vm-runtime/objects/index.ts";

/** What the fake runtime does with the channel the host opened. */
type Script = (socket: Socket, head: Buffer) => void;

let dir: string;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), "object-channel-"));
});
after(() => rm(dir, { recursive: true, force: true }));

let served = 0;
/** A fake object runtime on a fresh socket; its channel runs `script`, its calls `call`. */
async function fakeRuntime(
  t: TestContext,
  script: Script,
  call?: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<string> {
  const socketPath = join(dir, `runtime-${++served}.sock`);
  const server: Server = createServer((req, res) => {
    if (req.method === "POST" && call) return call(req, res);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({ status: "ok", methods: [], object: { idleSeconds: 60, hibernate: "none", alarm: false } }),
    );
  });
  server.on("upgrade", (_req, socket: Socket, head: Buffer) => {
    socket.on("error", () => {}); // the host resets what it closes
    socket.write("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: object-channel\r\n\r\n");
    script(socket, head);
  });
  server.listen(socketPath);
  await once(server, "listening");
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return socketPath;
}

/** Storage in memory whose calls wait for `release()` while `held`. */
function memoryStorage() {
  const values = new Map<string, unknown>();
  let gate: Promise<void> = Promise.resolve();
  let open = () => {};
  const wait = () => gate;
  const storage: ObjectStorage = {
    get: (key) => wait().then(() => values.get(key)),
    put: (key, value) => wait().then(() => void values.set(key, value)),
    delete: (key) => wait().then(() => values.delete(key)),
    list: () => wait().then(() => ({ items: [...values].map(([key, value]) => ({ key, value })) })),
  };
  return {
    storage,
    hold() {
      gate = new Promise((resolve) => (open = resolve));
    },
    release: () => open(),
  };
}

const noAlarms: ObjectAlarms = {
  set: async (_object, at) => at,
  get: async () => null,
  delete: async () => {},
};

async function session(t: TestContext, socketPath: string, storage: ObjectStorage): Promise<ObjectSession> {
  const logged: string[] = [];
  const opened = await openObjectSession({
    upstream: { socketPath, headers: {} },
    object: { principal: "alice", image: "counter", name: "c" },
    storage,
    alarms: noAlarms,
    log: (message) => logged.push(message),
  });
  t.after(() => opened.close());
  return opened;
}

/** An answer line as the fake runtime reads it. */
interface Reply {
  readonly id: number;
  readonly ok: boolean;
  readonly value?: unknown;
  readonly error: { _tag: string; message: string; status?: number };
}

/** Reads answer lines from the host until `count` came. */
function answers(socket: Socket, count: number): Promise<Reply[]> {
  return new Promise((resolve) => {
    let text = "";
    const got: Reply[] = [];
    socket.on("data", (chunk: Buffer) => {
      text += chunk.toString("utf8");
      for (let at = text.indexOf("\n"); at !== -1; at = text.indexOf("\n")) {
        got.push(JSON.parse(text.slice(0, at)));
        text = text.slice(at + 1);
      }
      if (got.length >= count) resolve(got);
    });
  });
}

/** The channel's socket and its first bytes, once the fake runtime has it. */
function channel(): { script: Script; opened: Promise<{ socket: Socket; head: Buffer }> } {
  let opened!: (value: { socket: Socket; head: Buffer }) => void;
  const promise = new Promise<{ socket: Socket; head: Buffer }>((resolve) => (opened = resolve));
  return { script: (socket, head) => opened({ socket, head }), opened: promise };
}

describe("object channel", () => {
  test("object channel - answers requests by id; unknown operations and bad fields are answered as errors", async (t) => {
    const { script, opened } = channel();
    await session(t, await fakeRuntime(t, script), memoryStorage().storage);
    const { socket } = await opened;
    const replies = answers(socket, 5);
    socket.write(
      [
        '{"id":1,"op":"put","key":"k","value":{"a":[1,2]}}',
        '{"id":2,"op":"explode"}',
        '{"id":3,"op":"get"}',
        '{"id":4,"op":"list","limit":"all"}',
        '{"id":5,"op":"get","key":"k"}',
        "",
      ].join("\n"),
    );
    const byId = new Map((await replies).map((reply) => [reply.id, reply]));
    assert.deepEqual(byId.get(1), { id: 1, ok: true });
    assert.equal(byId.get(2)?.error._tag, "ObjectChannelInvalid");
    assert.match(byId.get(2)?.error.message ?? "", /no operation "explode"/);
    assert.equal(byId.get(3)?.error._tag, "ObjectChannelInvalid");
    assert.equal(byId.get(4)?.error._tag, "ObjectChannelInvalid");
    assert.deepEqual(byId.get(5), { id: 5, ok: true, value: { a: [1, 2] } });
  });

  test("object channel - requests past the in-flight bound are answered busy, the rest served", async (t) => {
    const memory = memoryStorage();
    memory.hold();
    const { script, opened } = channel();
    await session(t, await fakeRuntime(t, script), memory.storage);
    const { socket } = await opened;
    const busy = answers(socket, 8);
    socket.write(Array.from({ length: 40 }, (_, id) => `{"id":${id},"op":"get","key":"k${id}"}\n`).join(""));
    const refused = await busy;
    assert.deepEqual(
      refused.map((reply) => reply.id),
      [32, 33, 34, 35, 36, 37, 38, 39],
    );
    for (const reply of refused) assert.equal(reply.error._tag, "ObjectChannelBusy");
    socket.removeAllListeners("data");
    const served = answers(socket, 32);
    memory.release();
    const ok = await served;
    assert.equal(ok.filter((reply) => reply.ok).length, 32);
    // Once they are answered, new requests are served again.
    socket.removeAllListeners("data");
    const next = answers(socket, 1);
    socket.write('{"id":99,"op":"get","key":"k"}\n');
    assert.deepEqual(await next, [{ id: 99, ok: true }]);
  });

  for (const [what, bytes] of [
    ["a line that is not JSON", "{not json\n"],
    ["a request without an id", '{"op":"get","key":"k"}\n'],
    ["a JSON value that is no request", "[1,2,3]\n"],
    ["a line over the limit", Buffer.alloc(400 * 1024, "x")],
  ] as const)
    test(`object channel - ${what} closes the channel, and the host opens the next`, async (t) => {
      const garbage = await session(t, await fakeRuntime(t, (socket) => socket.write(bytes)), memoryStorage().storage);
      await garbage.closed;
      const { script, opened } = channel();
      await session(t, await fakeRuntime(t, script), memoryStorage().storage);
      const { socket } = await opened;
      const reply = answers(socket, 1);
      socket.write('{"id":1,"op":"delete","key":"k"}\n');
      assert.deepEqual(await reply, [{ id: 1, ok: true, value: false }]);
    });

  test("object channel - a call's answer is read up to its bound, and one cut short rejects", async (t) => {
    const huge = Buffer.alloc(64 * 1024, "x");
    const socketPath = await fakeRuntime(
      t,
      () => {},
      (req, res) => {
        if (req.url === "/__rpc__/cut") {
          res.writeHead(200, { "content-length": "100" });
          return res.end("{", () => res.destroy());
        }
        res.writeHead(200);
        for (let i = 0; i < 32; i++) res.write(huge);
        res.end();
      },
    );
    const opened = await openObjectSession({
      upstream: { socketPath, headers: {} },
      object: { principal: "alice", image: "counter", name: "c" },
      storage: memoryStorage().storage,
      alarms: noAlarms,
      limits: { answerBytes: 256 * 1024 },
    });
    t.after(() => opened.close());
    const answer = await opened.call("big", []);
    assert.equal(answer.status, 502);
    assert.equal(JSON.parse(Buffer.from(answer.body).toString()).error._tag, "ObjectAnswerTooLarge");
    await assert.rejects(opened.call("cut", []), /closed its answer before it ended|aborted|socket hang up/);
    const alarm = await opened.alarm();
    assert.equal(alarm.status, 502, "the session goes on");
  });

  test("object channel - a runtime that does not read its answers is not read either, until it reads", async (t) => {
    const big = "x".repeat(100 * 1024);
    const requests = 200;
    let served = 0;
    let allServed = () => {};
    const storage: ObjectStorage = {
      ...memoryStorage().storage,
      get: async () => {
        if (++served === requests) allServed();
        return big;
      },
    };
    // The host stops reading the channel (it pauses its socket) once its unread answers pile up.
    const piledUp = new Promise<number>((resolve) => {
      const pause = Socket.prototype.pause;
      t.after(() => {
        Socket.prototype.pause = pause;
      });
      Socket.prototype.pause = function (this: Socket) {
        if (this.writableLength > 1024 * 1024) resolve(this.writableLength);
        return pause.call(this);
      };
    });
    const { script, opened } = channel();
    await session(t, await fakeRuntime(t, script), storage);
    const { socket } = await opened;
    // Padded requests, so that the host reads them a few at a time.
    const pad = "p".repeat(64 * 1024);
    for (let id = 0; id < requests; id++) socket.write(`{"id":${id},"op":"get","key":"k","pad":"${pad}"}\n`);
    // A host that read on would serve them all, the answers piling up in its memory.
    const unread = await Promise.race([
      piledUp,
      new Promise<never>((_, reject) => (allServed = () => reject(new Error("every request was served unread")))),
    ]);
    assert.ok(unread < 8 * 1024 * 1024, `${unread} bytes of answers held`);
    assert.ok(served < requests, `${served} of ${requests} served before the runtime read`);
    const all = await answers(socket, requests);
    assert.equal(all.length, requests, "once read, every request is answered");
    assert.ok(all.some((reply) => reply.ok));
  });

  test("object channel - a superseded write is answered as such and reported once", async (t) => {
    const refusing: ObjectStorage = {
      ...memoryStorage().storage,
      put: async () => {
        throw new ObjectError("ActivationSuperseded", 409, "superseded");
      },
    };
    const { script, opened } = channel();
    const reported: ObjectError[] = [];
    const socketPath = await fakeRuntime(t, script);
    const opening = openObjectSession({
      upstream: { socketPath, headers: {} },
      object: { principal: "alice", image: "counter", name: "c" },
      storage: refusing,
      alarms: noAlarms,
      onSuperseded: (err) => reported.push(err),
    });
    const { socket } = await opened;
    t.after(async () => (await opening).close());
    const replies = answers(socket, 2);
    socket.write('{"id":1,"op":"put","key":"k","value":1}\n{"id":2,"op":"put","key":"k","value":2}\n');
    for (const reply of await replies)
      assert.deepEqual(reply.error, { _tag: "ActivationSuperseded", message: "superseded", status: 409 });
    assert.equal(reported.length, 1);
  });
});

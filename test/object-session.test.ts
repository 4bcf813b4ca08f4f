// An object's code in a real instance (each isolating provider) with its storage and alarm in a
// real NATS, through the host's session: calls, durable storage a fresh instance continues on,
// list pages, alarms, bounds, a superseded activation's writes, floods and forged channel lines
// of hostile images, a gVisor checkpoint with the channel open; and a runtime on a TCP port.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsHandle } from "../platform/index.ts";
import {
  objectAlarms,
  objectStores,
  openObjectSession,
  type ObjectAnswer,
  type ObjectError,
  type ObjectRef,
  type ObjectSession,
  type ObjectStorage,
  type ObjectStores,
} from "../vm-runtime/objects/index.ts";
import {
  createProcessProvider,
  RUNTIME_PORT,
  upstreamOf,
  type IsolatedProvider,
  type MicrovmHandle,
  type Upstream,
} from "../vm-runtime/service/index.ts";
import { callInstance } from "./helpers/instance-rpc.ts";
import { lifo } from "./helpers/defer.ts";
import { objectsNats, testLease, type ObjectsNats, type TestLease } from "./helpers/objects.ts";
import { isolatedProviders, type ProviderKind } from "./helpers/providers.ts";
import { testImages } from "./images/paths.ts";

const defer = lifo(after);
let env: ObjectsNats;
let host: NatsHandle;
let stores: ObjectStores;
let n = 0;
const fresh = (): ObjectRef => ({ principal: "alice", image: "counter", name: `object ${++n}/é` });

before(async () => {
  env = await objectsNats(defer);
  host = await env.as();
  stores = objectStores(host.requester);
});

const json = (answer: ObjectAnswer): unknown => JSON.parse(Buffer.from(answer.body).toString("utf8"));

/** The answer's value; fails on a non-200 answer. */
async function value(answer: Promise<ObjectAnswer>): Promise<unknown> {
  const got = await answer;
  assert.equal(got.status, 200, JSON.stringify(json(got)));
  return json(got);
}

/** The error of a non-2xx answer (its envelope's `error`). */
async function failure(answer: Promise<ObjectAnswer>, status: number): Promise<{ _tag: string; message: string }> {
  const got = await answer;
  const body = json(got) as { _tag: string; error: { _tag: string; message: string } };
  assert.equal(got.status, status, JSON.stringify(body));
  assert.equal(body._tag, "~alchemy/rpc/error");
  return body.error;
}

/** What an Upgrade to the object channel gets: 101, or the status it was refused with. */
function tryUpgrade(upstream: Upstream, headers: Record<string, string>, name: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({
      ...("socketPath" in upstream
        ? { socketPath: upstream.socketPath }
        : { host: upstream.host, port: upstream.port }),
      path: "/__object__/channel",
      agent: false,
      headers: { ...headers, connection: "Upgrade", upgrade: "object-channel", "x-object-name": name },
    });
    req.once("upgrade", (_res, socket) => {
      socket.destroy();
      resolve(101);
    });
    req.once("response", (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.once("error", reject);
    req.end();
  });
}

for (const kind of await isolatedProviders()) describeProvider(kind);

test("object session (process) - a runtime on a TCP port is reached the same way", async (t) => {
  const provider = createProcessProvider();
  t.after(() => provider.close());
  const handle = await provider.start({ microvmId: "obj-process", image: testImages.objectCounter });
  const object = fresh();
  const lease = testLease(host, object, "host-a");
  await lease.claim();
  const upstream = upstreamOf(handle, RUNTIME_PORT)!;
  assert.ok("port" in upstream, "a TCP upstream");
  const session = await openObjectSession({
    upstream,
    headers: handle.upstreamHeaders ?? {},
    object,
    storage: stores.open(object, lease.fence),
    alarms: objectAlarms(host.requester),
  });
  t.after(() => session.close());
  assert.equal(await value(session.call("inc", [2])), 2);
  assert.equal(await stores.open(object, lease.fence).get("n"), 2);
});

function describeProvider(kind: ProviderKind): void {
  let provider: IsolatedProvider;
  let started = 0;

  describe(`object session (${kind.name})`, () => {
    before(async () => {
      provider = await kind.create({
        hostKey: `object-session-${kind.name}-${process.pid}`,
        cpus: 0.5,
        pids: 32,
        memoryMiB: 96,
        scratchMiB: 8,
        totalMemoryMiB: 1024,
      });
    });
    after(() => provider.close());

    async function instance(t: TestContext, image: string = testImages.objectCounter): Promise<MicrovmHandle> {
      const handle = await provider.start({ microvmId: `obj-${kind.name}-${++started}`, image });
      t.after(() => provider.terminate(handle, 200));
      return handle;
    }

    interface Activated {
      readonly session: ObjectSession;
      readonly handle: MicrovmHandle;
      readonly superseded: ObjectError[];
    }

    async function activate(
      t: TestContext,
      object: ObjectRef,
      lease: TestLease,
      storage: ObjectStorage = stores.open(object, lease.fence),
      handle?: MicrovmHandle,
    ): Promise<Activated> {
      handle ??= await instance(t);
      const superseded: ObjectError[] = [];
      const session = await openObjectSession({
        upstream: provider.upstream(handle, RUNTIME_PORT) ?? upstreamOf(handle, RUNTIME_PORT)!,
        headers: handle.upstreamHeaders ?? {},
        object,
        storage,
        alarms: objectAlarms(host.requester),
        onSuperseded: (err) => superseded.push(err),
      });
      t.after(() => session.close());
      return { session, handle, superseded };
    }

    async function claimed(owner = "host-a"): Promise<{ object: ObjectRef; lease: TestLease }> {
      const object = fresh();
      const lease = testLease(host, object, owner);
      await lease.claim();
      return { object, lease };
    }

    test(`object session (${kind.name}) - a counter counts in storage, and a fresh instance continues it`, async (t) => {
      const { object, lease } = await claimed();
      const first = await activate(t, object, lease);
      assert.deepEqual(first.session.traits, { idleSeconds: 30, hibernate: "none", alarm: true });
      assert.equal(await value(first.session.call("name", [])), object.name);
      for (const expected of [1, 2, 3]) assert.equal(await value(first.session.call("inc", [])), expected);
      assert.equal(await stores.open(object, lease.fence).get("n"), 3);
      first.session.close();
      await first.session.closed;
      const second = await activate(t, object, lease);
      assert.equal(await value(second.session.call("inc", [])), 4);
      assert.equal(await value(second.session.call("inc", [10])), 14);
    });

    test(`object session (${kind.name}) - lists come a page at a time, filtered by prefix`, async (t) => {
      const { object, lease } = await claimed();
      const { session } = await activate(t, object, lease);
      for (const key of ["a1", "b1", "a2", "a3", "b2"]) await value(session.call("put", [key, { key }]));
      assert.equal(await value(session.call("remove", ["b2"])), true);
      assert.equal(await value(session.call("remove", ["b2"])), false);
      const keys: string[] = [];
      let cursor: string | undefined;
      let pages = 0;
      do {
        const page = (await value(session.call("list", [{ limit: 2, ...(cursor ? { cursor } : {}) }]))) as {
          keys: string[];
          values: Array<{ key: string }>;
          cursor?: string;
        };
        assert.deepEqual(
          page.values.map((v) => v.key),
          page.keys,
        );
        keys.push(...page.keys);
        cursor = page.cursor;
        pages++;
      } while (cursor);
      assert.deepEqual(keys, ["a1", "b1", "a2", "a3"]);
      assert.ok(pages >= 2, `${pages} pages`);
      const prefixed = (await value(session.call("list", [{ prefix: "a" }]))) as { keys: string[] };
      assert.deepEqual(prefixed.keys, ["a1", "a2", "a3"]);
    });

    test(`object session (${kind.name}) - alarms are set, read and deleted through the context, and run by alarm()`, async (t) => {
      const { object, lease } = await claimed();
      const { session } = await activate(t, object, lease);
      assert.equal(await value(session.call("getAlarm", [])), null);
      const at = Date.now() + 3_600_000;
      assert.equal(await value(session.call("setAlarm", [at])), at);
      assert.equal(await value(session.call("getAlarm", [])), at);
      assert.equal(await objectAlarms(host.requester).get(object), at);
      assert.equal(await value(session.call("deleteAlarm", [])), null);
      assert.equal(await value(session.call("getAlarm", [])), null);
      const invalid = await failure(session.call("setAlarm", ["soon"]), 400);
      assert.equal(invalid._tag, "AlarmInvalid");
      assert.equal(await value(session.alarm()), null);
      assert.equal(await value(session.alarm()), null);
      assert.equal(await stores.open(object, lease.fence).get("alarms"), 2);
    });

    test(`object session (${kind.name}) - values and keys over the bounds are refused to the caller with their error`, async (t) => {
      const { object, lease } = await claimed();
      const { session } = await activate(t, object, lease);
      const large = await failure(session.call("put", ["big", "x".repeat(200 * 1024)]), 400);
      assert.equal(large._tag, "StorageValueInvalid");
      assert.match(large.message, /at most 131072 bytes as JSON/);
      const key = await failure(session.call("put", ["k".repeat(513), 1]), 400);
      assert.equal(key._tag, "StorageKeyInvalid");
      assert.equal(await value(session.call("inc", [])), 1, "the activation works on");
    });

    test(`object session (${kind.name}) - a superseded activation's write is refused and reported once`, async (t) => {
      const { object, lease } = await claimed();
      const { session, superseded } = await activate(t, object, lease);
      assert.equal(await value(session.call("inc", [])), 1);
      await testLease(host, object, "host-b").claim();
      for (let i = 0; i < 2; i++) {
        const refused = await failure(session.call("inc", []), 409);
        assert.equal(refused._tag, "ActivationSuperseded");
      }
      assert.equal(superseded.length, 1);
      assert.equal(superseded[0]!._tag, "ActivationSuperseded");
      assert.equal(await stores.open(object, lease.fence).get("n"), 1);
    });

    test(`object session (${kind.name}) - a flood of storage calls is served a bounded number at a time`, async (t) => {
      const { object, lease } = await claimed();
      const real = stores.open(object, lease.fence);
      let inFlight = 0;
      let most = 0;
      const counted: ObjectStorage = {
        ...real,
        put: async (key, v) => {
          most = Math.max(most, ++inFlight);
          try {
            await real.put(key, v);
          } finally {
            inFlight--;
          }
        },
      };
      const { session } = await activate(t, object, lease, counted);
      const outcomes = (await value(session.call("flood", [300]))) as string[];
      assert.deepEqual(new Set(outcomes), new Set(["ok"]));
      assert.equal(outcomes.length, 300);
      assert.ok(most <= 32 && most > 1, `at most ${most} puts at once`);
      assert.equal(await real.get("flood-299"), 299);
    });

    test(`object session (${kind.name}) - a checkpoint closes the channel, and the restored instance takes a new one`, {
      skip: kind.name === "gvisor" ? false : "only gVisor checkpoints",
    }, async (t) => {
      const { object, lease } = await claimed();
      const { session, handle } = await activate(t, object, lease);
      assert.equal(await value(session.call("inc", [])), 1);
      assert.equal(await value(session.call("visits", [])), 1);
      const dir = await mkdtemp(join(tmpdir(), "object-checkpoint-"));
      t.after(() => rm(dir, { recursive: true, force: true }));
      await provider.checkpoint!(handle, dir);
      await session.closed;
      const restored = await provider.restore!({ microvmId: handle.microvmId }, dir);
      t.after(() => provider.terminate(restored, 200));
      const again = await openObjectSession({
        upstream: provider.upstream(restored, RUNTIME_PORT)!,
        headers: restored.upstreamHeaders ?? {},
        object,
        storage: stores.open(object, lease.fence),
        alarms: objectAlarms(host.requester),
      });
      t.after(() => again.close());
      assert.equal(await value(again.call("visits", [])), 2, "memory kept");
      assert.equal(await value(again.call("inc", [])), 2, "storage reached again");
      assert.equal(await value(again.call("name", [])), object.name);
    });

    for (const forged of ["broken", "huge"] as const)
      test(`object session (${kind.name}) - an image writing a ${forged} line loses its channel, the host goes on`, async (t) => {
        const { object, lease } = await claimed();
        const hostile = await instance(t, testImages.objectHostile);
        const first = await activate(t, object, lease, undefined, hostile);
        assert.equal(await value(first.session.call("put", ["k", 1])), null);
        assert.equal(await value(first.session.call("forge", [forged])), "ObjectChannelClosed");
        await first.session.closed;
        const again = await activate(t, object, lease, undefined, hostile);
        assert.equal(await value(again.session.call("get", ["k"])), 1, "a new channel serves it again");
      });

    test(`object session (${kind.name}) - an image forging a hundred requests at once is served a bounded number`, async (t) => {
      const { object, lease } = await claimed();
      const real = stores.open(object, lease.fence);
      let inFlight = 0;
      let most = 0;
      let answered = 0;
      const counted: ObjectStorage = {
        ...real,
        get: async (key) => {
          most = Math.max(most, ++inFlight);
          try {
            return await real.get(key);
          } finally {
            inFlight--;
            answered++;
          }
        },
      };
      const hostile = await instance(t, testImages.objectHostile);
      const { session } = await activate(t, object, lease, counted, hostile);
      assert.equal(await value(session.call("forge", ["flood"])), "answered");
      assert.ok(most <= 32, `at most ${most} gets at once`);
      assert.ok(answered < 101, `${answered} of the 101 gets served`);
      assert.equal(await value(session.call("get", ["k"])), null, "the channel serves on");
    });

    test(`object session (${kind.name}) - storage without a channel, and an image that is not an object`, async (t) => {
      const handle = await instance(t);
      const answer = await callInstance(handle, "inc", []);
      assert.equal(answer.status, 503);
      assert.equal((answer.body as { error: { _tag: string } }).error._tag, "ObjectChannelClosed");
      const upstream = provider.upstream(handle, RUNTIME_PORT)!;
      const secret = handle.upstreamHeaders ?? {};
      assert.equal(await tryUpgrade(upstream, {}, "a"), 403, "no secret, no channel");
      assert.equal(await tryUpgrade(upstream, secret, ""), 400, "an object has a name");
      assert.equal(await tryUpgrade(upstream, secret, "a"), 101);
      assert.equal(await tryUpgrade(upstream, secret, "b"), 409, "one instance, one object");
      const plain = await instance(t, testImages.probe);
      const { object, lease } = await claimed();
      await assert.rejects(
        openObjectSession({
          upstream: provider.upstream(plain, RUNTIME_PORT)!,
          headers: plain.upstreamHeaders ?? {},
          object,
          storage: stores.open(object, lease.fence),
          alarms: objectAlarms(host.requester),
        }),
        (err: ObjectError) => err._tag === "NotAnObject",
      );
      const plainUpstream = provider.upstream(plain, RUNTIME_PORT)!;
      assert.notEqual(await tryUpgrade(plainUpstream, plain.upstreamHeaders ?? {}, "a"), 101);
    });
  });
}

// Deleting objects on two microVM hosts (real NATS, instances of an object image, each host's
// object operations as it serves them): a delete runs where the object lives, in its mailbox, so
// an object called again through any host at once is listed and deletable, and calls racing a
// delete leave either a listed object with its storage or nothing: never storage without a record.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Kvm, type KV } from "@nats-io/kv";
import { OBJECTS_BUCKET } from "../platform/index.ts";
import { answerValue, type RelayedAnswer } from "../schemas/index.ts";
import {
  builtinImages,
  bundleImageModule,
  type MicrovmHost,
  type MicrovmHostOptions,
} from "../vm-runtime/service/index.ts";
import {
  objectAlarms,
  objectDirectory,
  objectHandlers,
  objectKey,
  objectStores,
  type ObjectHandlers,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import { rejected, withoutLogs } from "./helpers/objects.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, startMicrovmService, type MicrovmService } from "./helpers/microvm.ts";

const images = {
  tally: fileURLToPath(new URL("./images/object-tally.ts", import.meta.url)),
  sandbox: builtinImages.sandbox,
};
const hostOptions: Partial<MicrovmHostOptions> = { images };

const defer = lifo(after);
let svc: MicrovmService;
let a: MicrovmHost;
let b: MicrovmHost;
let onA: ObjectHandlers;
let onB: ObjectHandlers;
let bucket: KV;
let n = 0;
const fresh = (): ObjectRef => ({ principal: "alice", image: "tally", name: `object ${++n}` });
const context = (object: ObjectRef) => ({ principal: object.principal }) as never;

/** The object operations as `host` serves them (its own directory, as each host has). */
const handlersOf = (host: MicrovmHost, requester: MicrovmService["handle"]["requester"]) =>
  objectHandlers({
    activations: host.objects,
    directory: objectDirectory(requester),
    stores: objectStores(requester),
    alarms: objectAlarms(requester),
    ...withoutLogs,
  });

/** Calls `method` through `handlers`: its JSON answer (a 200). */
async function call(handlers: ObjectHandlers, object: ObjectRef, method: string, args: unknown[] = []) {
  const answer = (await handlers.callObject(
    { image: object.image, name: object.name, method, args },
    context(object),
  )) as RelayedAnswer;
  const text = Buffer.from(answer.body).toString("utf8");
  assert.equal(answer.status, 200, text);
  return JSON.parse(text) as unknown;
}

const remove = (handlers: ObjectHandlers, object: ObjectRef) =>
  handlers.deleteObject({ image: object.image, name: object.name }, context(object));
const get = async (handlers: ObjectHandlers, object: ObjectRef) =>
  answerValue(await handlers.getObject({ image: object.image, name: object.name }, context(object)));

/** The keys of the objects bucket under `object`'s storage prefix, and their values. */
async function storedKeys(object: ObjectRef): Promise<Map<string, unknown>> {
  const stored = new Map<string, unknown>();
  for await (const key of await bucket.keys(`${objectKey(object)}.*`)) {
    const entry = await bucket.get(key);
    if (entry && entry.operation === "PUT") stored.set(key, entry.json());
  }
  return stored;
}

const listed = async (object: ObjectRef) =>
  answerValue(await onA.listObjects({ image: object.image, limit: "1000" }, context(object))).items.some(
    (item) => item.name === object.name,
  );

before(async () => {
  svc = await startMicrovmService(defer, hostOptions);
  a = svc.host;
  const second = await svc.addHost(hostOptions);
  b = second.host;
  onA = handlersOf(a, svc.handle.requester);
  onB = handlersOf(b, second.handle.requester);
  bucket = await new Kvm(svc.handle.nc).open(OBJECTS_BUCKET);
});
after(() => assertNoInstanceLeft());

describe("object deletes", () => {
  it("object deletes - deleted through one host, called at once through another: listed and deletable, with the new call's storage alone", async () => {
    const object = fresh();
    assert.equal(await call(onA, object, "inc", [5]), 5);
    await remove(onB, object);
    assert.equal(await call(onA, object, "inc", [1]), 1);
    const got = await get(onB, object);
    assert.equal(got.active, true);
    assert.ok(await listed(object), "listed");
    assert.deepEqual([...(await storedKeys(object)).values()], [1], "the new call's storage alone");
    await remove(onB, object);
    assert.equal((await rejected(() => get(onA, object)))._tag, "ObjectNotFound");
    assert.equal((await storedKeys(object)).size, 0);
    assert.equal(await a.objects.activeOn(object), undefined);
  });

  it("object deletes - an inactive object is deleted without starting it, even with its image gone", async () => {
    // An image of the registry, its principal's (as the NATS API's internal caller).
    const module = await bundleImageModule(images.tally);
    await svc.overNats.createImage({ name: "tally-gone", module });
    const object: ObjectRef = { principal: "nats:internal", image: "tally-gone", name: `object ${++n}` };
    assert.equal(await call(onB, object, "inc", [3]), 3);
    await b.objects.deactivate(object);
    await svc.overNats.deleteImage({ name: "tally-gone" });
    await remove(onA, object);
    for (const host of [a, b])
      assert.equal(await host.objects.activeOn(object), undefined, "not started by the delete");
    assert.equal(await listed(object), false);
    assert.equal((await storedKeys(object)).size, 0);
  });

  it("object deletes - calls racing a delete through both hosts: a listed object with the storage of the calls after it, or nothing", async (t) => {
    for (let round = 0; round < 6; round++) {
      const object = fresh();
      // Before the delete the tally is past 100; the calls after it count again from 1.
      assert.equal(await call(round % 2 ? onB : onA, object, "inc", [100]), 100);
      // Calls one after another through each host while the delete runs (in odd rounds one more after it).
      let deleting = true;
      const calls = async (handlers: ObjectHandlers) => {
        const answers: number[] = [];
        do answers.push((await call(handlers, object, "inc", [1])) as number);
        while (deleting);
        if (round % 2) answers.push((await call(handlers, object, "inc", [1])) as number);
        return answers;
      };
      const callers = [onA, onB, onA, onB].map(calls);
      await remove(round % 2 ? onA : onB, object).finally(() => {
        deleting = false;
      });
      const answers = (await Promise.all(callers)).flat();
      const after = answers.filter((value) => value < 100).sort((x, y) => x - y);
      const stored = await storedKeys(object);
      t.diagnostic(
        `round ${round}: ${answers.length - after.length} calls ran before the delete, ${after.length} after`,
      );
      if (after.length === 0) {
        assert.equal(stored.size, 0, "no call after the delete: nothing stored");
        assert.equal(await listed(object), false);
      } else {
        assert.deepEqual(
          after,
          after.map((_, i) => i + 1),
          "the calls after the delete counted from nothing",
        );
        assert.deepEqual([...stored.values()], [after.length], "their storage alone");
        assert.ok(await listed(object), `round ${round}: storage, and listed`);
        assert.equal((await get(onB, object)).storageBytes > 0, true);
        await remove(onA, object);
        assert.equal((await storedKeys(object)).size, 0);
      }
    }
  });
});

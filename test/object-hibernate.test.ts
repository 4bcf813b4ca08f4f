// Objects with `hibernate: "snapshot"` on microVM hosts (gVisor): an idle eviction, or its host
// stopping, checkpoints the instance into the object's snapshot, and its next call restores it,
// memory and all, on the same host or on another; the snapshot goes once it runs and when the
// object is deleted. An object with `hibernate: "none"` starts afresh.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { fileURLToPath } from "node:url";
import { OBJECTS_BUCKET, snapshotObjectBucket, versionedStore, type VersionedStore } from "../platform/index.ts";
import { leaseOwner } from "../placement/index.ts";
import { nameToken } from "../schemas/index.ts";
import type { MicrovmHost, MicrovmHostOptions } from "../vm-runtime/service/index.ts";
import {
  objectAlarms,
  objectDirectory,
  objectHandlers,
  objectKey,
  objectStores,
  snapshotIdOf,
  type ObjectRef,
} from "../vm-runtime/objects/index.ts";
import { until, withoutLogs } from "./helpers/objects.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, startMicrovmService, type MicrovmService } from "./helpers/microvm.ts";
import { gvisorSkip } from "./helpers/providers.ts";

const image = (file: string) => fileURLToPath(new URL(`./images/${file}`, import.meta.url));
const images = {
  hibernating: image("object-tally-hibernating.ts"),
  long: image("object-tally-hibernating-long.ts"),
  brief: image("object-tally-brief.ts"),
};
// The service's default lease TTL (3 s): a gVisor restore on a loaded machine may delay renewals.
const hostOptions: Partial<MicrovmHostOptions> = { images };

const skip = await gvisorSkip();
const defer = lifo(after);
let svc: MicrovmService;
let a: MicrovmHost;
let snapshots: ObjectStore;
let leases: VersionedStore;
let n = 0;
const fresh = (imageName = "hibernating"): ObjectRef => ({
  principal: "alice",
  image: imageName,
  name: `object ${++n}`,
});

const call = async (host: MicrovmHost, object: ObjectRef, method: string, args: unknown[] = []) => {
  const answer = await host.objects.call(object, method, args);
  const body = Buffer.from(answer.body).toString("utf8");
  assert.equal(answer.status, 200, body);
  return JSON.parse(body) as unknown;
};

/** The name of the object's snapshot in the snapshot store. */
const snapshotName = (object: ObjectRef) => `${nameToken(object.principal)}/${nameToken(snapshotIdOf(object))}`;

/** Whether the object's snapshot is stored. */
const stored = async (object: ObjectRef) => {
  const info = await snapshots.info(snapshotName(object));
  return info !== null && !info.deleted;
};

/** Resolves once no host holds `object` and its snapshot is stored (its idle eviction hibernated it). */
const hibernated = (host: MicrovmHost, object: ObjectRef) =>
  until(async () => (await host.objects.activeOn(object)) === undefined && (await stored(object)));

before(async () => {
  if (skip) return;
  svc = await startMicrovmService(defer, hostOptions);
  a = svc.host;
  snapshots = await new Objm(svc.handle.nc).open(snapshotObjectBucket);
  leases = versionedStore(svc.handle.requester, OBJECTS_BUCKET);
});
after(() => assertNoInstanceLeft());

describe("objects hibernating", { skip }, () => {
  it("objects hibernating - an idle object keeps its memory to its next call; the snapshot goes once it runs", async (t) => {
    const object = fresh();
    assert.equal(await call(a, object, "visits"), 1);
    assert.equal(await call(a, object, "inc", [1]), 1);
    await hibernated(a, object);
    const bytes = (await snapshots.info(snapshotName(object)))?.size ?? 0;
    t.diagnostic(`its snapshot holds ${(bytes / 2 ** 20).toFixed(1)} MiB`);
    const started = performance.now();
    assert.equal(await call(a, object, "visits"), 2, "memory kept");
    t.diagnostic(`the first call restoring it took ${Math.round(performance.now() - started)} ms`);
    assert.equal(await call(a, object, "read"), 1, "storage kept");
    assert.equal(await stored(object), false, "the snapshot is deleted once it runs");
    // And again: each eviction saves the memory of the last activation.
    await hibernated(a, object);
    assert.equal(await call(a, object, "visits"), 3);
  });

  it("objects hibernating - a host started after the object's host stopped restores it from the store", async () => {
    const object = fresh();
    const first = (await svc.addHost(hostOptions)).host;
    assert.equal(await call(first, object, "visits"), 1);
    await hibernated(first, object);
    await first.close();
    const next = (await svc.addHost(hostOptions)).host;
    assert.equal(await call(next, object, "visits"), 2, "memory kept");
    assert.equal(await next.objects.activeOn(object), next.hostId);
    await next.close();
  });

  it("objects hibernating - a host that stops hibernates its objects: another goes on with their memory at once", async (t) => {
    const object = fresh("long");
    const first = (await svc.addHost(hostOptions)).host;
    assert.equal(await call(first, object, "visits"), 1);
    assert.equal(await call(first, object, "visits"), 2);
    const started = performance.now();
    await first.close();
    t.diagnostic(`the stop, its object hibernated, took ${Math.round(performance.now() - started)} ms`);
    assert.equal(leaseOwner((await leases.get(objectKey(object))).value), undefined, "its lease was released");
    assert.ok(await stored(object), "its snapshot is stored");
    assert.equal(await call(a, object, "visits"), 3, "memory kept");
    assert.equal(await a.objects.activeOn(object), a.hostId);
  });

  it("objects hibernating - deleting a hibernated object deletes its snapshot", async () => {
    const handlers = objectHandlers({
      ...withoutLogs,
      activations: a.objects,
      directory: objectDirectory(svc.handle.requester),
      stores: objectStores(svc.handle.requester),
      alarms: objectAlarms(svc.handle.requester),
    });
    const object = fresh();
    const context = { principal: object.principal } as never;
    await handlers.callObject({ image: object.image, name: object.name, method: "visits", args: [] }, context);
    await hibernated(a, object);
    await handlers.deleteObject({ image: object.image, name: object.name }, context);
    assert.equal(await stored(object), false, "snapshot deleted");
    assert.equal(await call(a, object, "visits"), 1, "a new object");
  });

  it("objects hibernating - an object evicted to make room for another hibernates too", async () => {
    const small = (await svc.addHost({ ...hostOptions, objects: { maxActive: 1 } })).host;
    const first = fresh("long");
    const second = fresh("long");
    assert.equal(await call(small, first, "visits"), 1);
    assert.equal(await call(small, second, "visits"), 1);
    assert.ok(await stored(first), "the first hibernated to make room");
    assert.equal(await call(small, first, "visits"), 2, "memory kept");
    assert.equal(await call(small, second, "visits"), 2, "memory kept");
    await small.close();
  });

  it("objects hibernating - a damaged snapshot: the object starts afresh with its storage, and the snapshot goes", async () => {
    const object = fresh();
    assert.equal(await call(a, object, "inc", [2]), 2);
    await hibernated(a, object);
    await snapshots.putBlob({ name: snapshotName(object) }, randomBytes(64 * 1024));
    assert.equal(await call(a, object, "visits"), 1, "started afresh");
    assert.equal(await call(a, object, "read"), 2, "storage kept");
    assert.equal(await stored(object), false);
  });

  it("objects hibernating - past its principal's snapshot quota an object is evicted as with hibernate none", async () => {
    const tight = (await svc.addHost({ ...hostOptions, snapshotQuotaMiB: 1 })).host;
    const object = fresh();
    assert.equal(await call(tight, object, "visits"), 1);
    assert.equal(await call(tight, object, "inc", [1]), 1);
    await until(async () => (await tight.objects.activeOn(object)) === undefined);
    assert.equal(await stored(object), false, "no snapshot");
    assert.equal(await call(tight, object, "visits"), 1, "memory lost");
    assert.equal(await call(tight, object, "read"), 1, "storage kept");
    await tight.close();
  });

  it("objects hibernating - an object with hibernate none loses its memory when evicted", async (t) => {
    const object = fresh("brief");
    assert.equal(await call(a, object, "visits"), 1);
    await until(async () => (await a.objects.activeOn(object)) === undefined);
    assert.equal(await stored(object), false, "no snapshot");
    const started = performance.now();
    assert.equal(await call(a, object, "visits"), 1, "memory lost");
    t.diagnostic(`the first call starting it afresh took ${Math.round(performance.now() - started)} ms`);
  });
});

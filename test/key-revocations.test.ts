// The record of revoked API keys on a real nats-server, as its two roles use it: the gateway
// writes it (revision-checked, two gateways at once both land), a host watches it and refuses
// tokens issued under a revoked key before (or just after) its revocation, not later ones.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  bucketNames,
  connectNats,
  openBuckets,
  provisionBuckets,
  recordRevocations,
  REVOCATION_KEEP_MS,
  REVOCATION_SKEW_MS,
  versionedStore,
  watchRevocations,
  type NatsHandle,
  type RevokedKeys,
} from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats } from "./helpers/nats.ts";

const defer = lifo(after);

describe("key revocations", () => {
  let gateway: NatsHandle;
  let host: NatsHandle;
  before(async () => {
    const nats = await testNats(defer);
    gateway = await connectNats({ ...nats.login("gateway"), name: "revocations-gateway" });
    defer(() => gateway.close());
    host = await connectNats({ ...nats.login("microvms"), name: "revocations-host" });
    defer(() => host.close());
    // As at start: the provisioning user makes the bucket, the gateway only opens it.
    const provision = await connectNats({ ...nats.login("provision"), name: "revocations-provision" });
    await provisionBuckets(provision.nc, { only: ["keyRevocations"] });
    await provision.close();
    await openBuckets(gateway.nc, { only: ["keyRevocations"] });
  });

  it("key revocations - a host's watch sees a recorded key within its period and refuses only what it issued before", async () => {
    const everyMs = 100;
    const watch = await watchRevocations(host.requester, everyMs);
    defer(() => watch.close());
    const changed = new Promise<RevokedKeys>((resolve) => watch.onChange(resolve));
    const at = Date.now();
    await recordRevocations(gateway.requester, ["key-one"], at);
    const started = performance.now();
    const seen = await changed;
    // One period plus a read: the bound the watch promises.
    assert.ok(performance.now() - started < everyMs + 1_000, "seen within a period");
    assert.equal(seen.get("key-one"), at);
    assert.equal(watch.revoked("key-one", at - 30 * 60_000), true, "issued before");
    assert.equal(watch.revoked("key-one", at + REVOCATION_SKEW_MS), true, "issued within the clock skew");
    assert.equal(watch.revoked("key-one", at + REVOCATION_SKEW_MS + 1), false, "issued after (the key added again)");
    assert.equal(watch.revoked("key-two", at), false, "another key");
    assert.equal(watch.revoked(undefined, at), false, "a token without a key");
  });

  it("key revocations - a watch started after a revocation knows it from its first read", async () => {
    const at = Date.now();
    await recordRevocations(gateway.requester, ["key-earlier"], at);
    const watch = await watchRevocations(host.requester, 60_000);
    defer(() => watch.close());
    assert.equal(watch.revoked("key-earlier", at), true);
  });

  it("key revocations - two gateways recording at once both land", async () => {
    await Promise.all(Array.from({ length: 8 }, (_, i) => recordRevocations(gateway.requester, [`key-at-once-${i}`])));
    const watch = await watchRevocations(host.requester, 60_000);
    defer(() => watch.close());
    for (let i = 0; i < 8; i++) assert.equal(watch.revoked(`key-at-once-${i}`, Date.now() - 1), true, `key ${i}`);
  });

  it("key revocations - an entry past its keep is dropped on the next write", async () => {
    const longAgo = Date.now() - REVOCATION_KEEP_MS - 1;
    await recordRevocations(gateway.requester, ["key-old"], longAgo);
    await recordRevocations(gateway.requester, ["key-new"]);
    const entry = await versionedStore(gateway.requester, bucketNames.keyRevocations).get("revoked");
    const record = JSON.parse(Buffer.from(entry.value!).toString()) as Record<string, number>;
    assert.equal(record["key-old"], undefined);
    assert.ok(record["key-new"]! > 0);
  });
});

// Launch snapshots on real runsc: an image is imported once into a template with no identity and
// saved; instances restored from that one snapshot each get their own id and secret after the
// restore, draw different randomness (crypto, Math.random, keys), keep their own files, and a
// damaged snapshot makes the start fall back to a cold one, logged once.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, truncate } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createGvisorProvider, type IsolatedProvider, type MicrovmHandle } from "../vm-runtime/service/index.ts";
import { callInstance, rpc } from "./helpers/instance-rpc.ts";
import { assertNoInstanceLeft } from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";
import { gvisorSkip } from "./helpers/providers.ts";

interface Sample {
  readonly uuid: string;
  readonly values: string;
  readonly webValues: string;
  readonly bytes: string;
  readonly int: number;
  readonly math: number;
  readonly publicKey: string;
  readonly microvmId: string;
  readonly atImport: { readonly uuid: string; readonly math: number; readonly at: number };
}

const HEAP_MIB = 96;
const skipGvisor = await gvisorSkip();

describe("microvm launch snapshots", { skip: skipGvisor }, () => {
  let provider: IsolatedProvider;
  const logged: string[] = [];
  let coldImport: Sample["atImport"];

  before(async () => {
    provider = await createGvisorProvider({
      hostKey: `launch-snapshot-test-${process.pid}`,
      memoryMiB: HEAP_MIB,
      scratchMiB: 8,
      totalMemoryMiB: 1536,
      warmInstances: 0,
      // Every image gets a snapshot after its first cold start, and every start restores it,
      // whatever this machine's speed (the rule that picks is test/microvm-launch-policy.test.ts's).
      launchSnapshots: { minColdMs: 0, alwaysRestore: true },
      log: (message) => logged.push(message),
    });
    const cold = await provider.start({ microvmId: "entropy-cold", image: testImages.entropy });
    coldImport = (await rpc<Sample>(cold, "sample")).atImport;
    await provider.terminate(cold, 200);
    await provider.launchSnapshots!.settled();
  });
  after(async () => {
    await provider.close();
    await assertNoInstanceLeft();
  });

  /** The one image this provider has timed (the entropy image, at HEAP_MIB). */
  function entropyKey(): string {
    const keys = provider.launchSnapshots!.keys();
    assert.equal(keys.length, 1, `one image timed: ${keys.join(", ")}`);
    assert.ok(keys[0]!.endsWith(`-${HEAP_MIB}`));
    return keys[0]!;
  }

  async function restored(t: TestContext, id: string): Promise<MicrovmHandle> {
    const handle = await provider.start({ microvmId: id, image: testImages.entropy });
    t.after(() => provider.terminate(handle, 200));
    return handle;
  }

  test("microvm launch snapshots - two instances restored from one snapshot draw different randomness", async (t) => {
    const key = entropyKey();
    assert.equal(provider.launchSnapshots!.stats(key).saved, true, "the first cold start left a launch snapshot");
    const [a, b] = await Promise.all([restored(t, "entropy-a"), restored(t, "entropy-b")]);
    assert.equal(provider.launchSnapshots!.stats(key).restoreMs.length, 2, "both started from the snapshot");
    const [one, two] = await Promise.all([rpc<Sample>(a, "sample"), rpc<Sample>(b, "sample")]);
    // One snapshot: what the import drew is shared, and is not the cold start's.
    assert.deepEqual(one.atImport, two.atImport, "both were restored from the same import");
    assert.notDeepEqual(one.atImport, coldImport, "a restored instance did not import its image again");
    assert.deepEqual([one.microvmId, two.microvmId], ["entropy-a", "entropy-b"]);
    for (const field of ["uuid", "values", "webValues", "bytes", "int", "math", "publicKey"] as const)
      assert.notEqual(one[field], two[field], `${field} is the same in two restored instances`);
  });

  test("microvm launch snapshots - a restored instance accepts only its own secret", async (t) => {
    const [a, b] = await Promise.all([restored(t, "secret-a"), restored(t, "secret-b")]);
    assert.notDeepEqual(a.upstreamHeaders, b.upstreamHeaders, "two restored instances share a secret");
    assert.equal((await callInstance(a, "sample")).status, 200);
    assert.equal((await callInstance({ ...a, upstreamHeaders: b.upstreamHeaders }, "sample")).status, 403);
    assert.equal((await callInstance({ ...b, upstreamHeaders: a.upstreamHeaders }, "sample")).status, 403);
    assert.equal((await callInstance({ ...a, upstreamHeaders: {} }, "sample")).status, 403);
  });

  test("microvm launch snapshots - a file one restored instance writes is not the other's", async (t) => {
    const [a, b] = await Promise.all([restored(t, "files-a"), restored(t, "files-b")]);
    await rpc(a, "writeNote", ["only a's"]);
    assert.equal(await rpc(b, "readNote"), null);
    assert.equal(await rpc(a, "readNote"), "only a's");
  });

  test("microvm launch snapshots - an instance started from one suspends and resumes with its own state", async (t) => {
    const key = entropyKey();
    const live = { current: await restored(t, "suspended-a") };
    t.after(() => provider.terminate(live.current, 200));
    const other = await restored(t, "suspended-b");
    await rpc(live.current, "writeNote", ["kept"]);
    const before = await rpc<Sample>(live.current, "sample");
    const dir = await mkdtemp(join(tmpdir(), "launch-suspend-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    await provider.checkpoint!(live.current, dir);
    live.current = await provider.restore!({ microvmId: "suspended-a" }, dir);
    assert.equal(await rpc(live.current, "readNote"), "kept");
    const after = await rpc<Sample>(live.current, "sample");
    assert.deepEqual([after.microvmId, after.atImport], [before.microvmId, before.atImport]);
    assert.equal(
      (await callInstance({ ...live.current, upstreamHeaders: other.upstreamHeaders }, "sample")).status,
      403,
    );
    assert.equal(await rpc(other, "readNote"), null);
    assert.equal(provider.launchSnapshots!.stats(key).saved, true);
  });

  test("microvm launch snapshots - a damaged snapshot: the start is cold, logged once, no process left", async (t) => {
    const key = entropyKey();
    const dir = provider.launchSnapshots!.stats(key).dir!;
    for (const name of await readdir(dir)) await truncate(join(dir, name), 16);
    const before = logged.length;
    const first = await restored(t, "damaged-1");
    const second = await restored(t, "damaged-2");
    const [one, two] = await Promise.all([rpc<Sample>(first, "sample"), rpc<Sample>(second, "sample")]);
    assert.notDeepEqual(one.atImport, two.atImport, "both started cold (each imported its image)");
    assert.equal(logged.length - before, 1, `one line: ${logged.slice(before).join(" | ")}`);
    assert.match(logged.at(-1)!, /failed to restore; its instances start cold/);
    assert.equal(provider.launchSnapshots!.stats(key).broken, true);
    await assert.rejects(readdir(dir), { code: "ENOENT" }, "the damaged snapshot was deleted");
  });
});

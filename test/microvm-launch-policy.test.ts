// The launch snapshots' rule, with the walls faked: a snapshot is taken only for an image whose
// cold starts are slow, used only while restores are faster than cold starts, and a failed
// restore is logged once and sends the image back to cold starts for good.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LOADED_LINE } from "../vm-runtime/runtime/boot.ts";
import type { RestoreSource, Tracked } from "../vm-runtime/host/isolated-walls.ts";
import { launchSnapshots, type LaunchSnapshotOptions } from "../vm-runtime/host/launch-snapshots.ts";
import type { MicrovmHandle } from "../vm-runtime/service/index.ts";

const MODULE = Buffer.from("export default 1");

/** A fake provider: `restoreFails` makes restores throw; `boots` records every boot. */
async function fakeWalls(options: LaunchSnapshotOptions = {}) {
  const dir = await mkdtemp(join(tmpdir(), "launch-policy-"));
  const boots: { template: boolean; restoring?: RestoreSource }[] = [];
  const logged: string[] = [];
  const state = { restoreFails: false };
  let released: () => void = () => undefined;
  const snapshots = launchSnapshots(
    {
      async boot(_heap, _deadline, _signal, restoring, template = false) {
        boots.push({ template, ...(restoring ? { restoring } : {}) });
        if (restoring && state.restoreFails) throw new Error("runsc restore failed");
        const stdout = new EventEmitter<{ line: [string] }>();
        const entry = {
          uid: 7,
          stopping: false,
          output: { stdout, stderrTail: [], booted: true },
          exited: new Promise<void>(() => undefined),
          released: new Promise<void>((resolve) => (released = resolve)),
          launched: {
            child: { stdin: { write: () => true } },
            checkpoint: async () => released(),
          },
        } as unknown as Tracked;
        if (template) setImmediate(() => stdout.emit("line", LOADED_LINE));
        return entry;
      },
      assign: async () => undefined,
      answering: async (_entry, microvmId) => ({ microvmId }) as MicrovmHandle,
      forceStop: async () => undefined,
      workDir: async () => dir,
      startTimeoutMs: 5_000,
      log: (message) => logged.push(message),
    },
    options,
  );
  return { snapshots, boots, logged, state, close: () => snapshots.close().then(() => rm(dir, { recursive: true })) };
}

describe("microvm launch policy", () => {
  test("microvm launch policy - fast cold starts get no snapshot, slow ones get one", async (t) => {
    const walls = await fakeWalls({ minColdMs: 1_000 });
    t.after(walls.close);
    for (const ms of [400, 500, 900]) walls.snapshots.noteCold("fast", MODULE, 96, ms);
    await walls.snapshots.settled();
    assert.equal(walls.boots.length, 0, "a template was booted for an image that starts in under a second");
    for (const ms of [1_500, 1_800, 2_000]) walls.snapshots.noteCold("slow", MODULE, 96, ms);
    await walls.snapshots.settled();
    assert.deepEqual(
      walls.boots.map((boot) => boot.template),
      [true],
      "one template for the slow image",
    );
    assert.equal(walls.snapshots.stats("slow").saved, true);
    assert.equal(await walls.snapshots.start("fast", "vm-fast", Date.now() + 5_000, undefined), undefined);
  });

  test("microvm launch policy - restores are used while faster, never after a slower median", async (t) => {
    const walls = await fakeWalls({ minColdMs: 0 });
    t.after(walls.close);
    // Cold starts of 0 ms: whatever a restore takes, it is not faster.
    walls.snapshots.noteCold("image", MODULE, 96, 0);
    await walls.snapshots.settled();
    const handle = await walls.snapshots.start("image", "vm-1", Date.now() + 5_000, undefined);
    assert.equal(handle?.microvmId, "vm-1", "the first start after the save is a restore");
    assert.equal(walls.boots.at(-1)?.restoring?.shared, true, "the restore shares the template's uid");
    assert.notEqual(walls.boots.at(-1)?.restoring?.secret, "", "the restore gets a secret of its own");
    assert.equal(walls.snapshots.stats("image").restoreMs.length, 1);
    const before = walls.boots.length;
    assert.equal(await walls.snapshots.start("image", "vm-2", Date.now() + 5_000, undefined), undefined);
    assert.equal(walls.boots.length, before, "a restore was tried though restores were slower");
  });

  test("microvm launch policy - a failed restore is logged once and the image starts cold after it", async (t) => {
    const walls = await fakeWalls({ minColdMs: 0 });
    t.after(walls.close);
    walls.snapshots.noteCold("image", MODULE, 96, 60_000);
    await walls.snapshots.settled();
    walls.state.restoreFails = true;
    for (const id of ["vm-1", "vm-2", "vm-3"])
      assert.equal(await walls.snapshots.start("image", id, Date.now() + 5_000, undefined), undefined);
    assert.equal(walls.logged.length, 1, walls.logged.join(" | "));
    assert.match(walls.logged[0]!, /failed to restore; its instances start cold from now on/);
    assert.deepEqual(walls.snapshots.stats("image"), {
      saved: false,
      dir: undefined,
      broken: true,
      coldMs: [60_000],
      restoreMs: [],
    });
    assert.equal(walls.boots.filter((boot) => boot.restoring).length, 1, "a broken snapshot was restored again");
  });
});

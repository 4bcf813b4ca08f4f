// The gVisor provider's checkpoint and restore against real runsc, with the counter image
// (state in memory and in a scratch file): no process of a checkpointed instance is left, a
// restore answers with the state it had, cycle after cycle, and a damaged image fails clearly.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, stat, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createGvisorProvider,
  MicrovmProviderError,
  type IsolatedProvider,
  type MicrovmHandle,
} from "../vm-runtime/service/index.ts";
import { rpc } from "./helpers/instance-rpc.ts";
import { assertNoInstanceLeft, instanceChildren, isGone } from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";
import { gvisorSkip } from "./helpers/providers.ts";

interface Counter {
  readonly memory: number;
  readonly file: number;
  readonly bornAt: string;
}

const skipGvisor = await gvisorSkip();

describe("gvisor checkpoint", { skip: skipGvisor }, () => {
  let provider: IsolatedProvider;
  let images: string;

  before(async () => {
    images = await mkdtemp(join(tmpdir(), "checkpoint-test-"));
    provider = await createGvisorProvider({
      hostKey: `checkpoint-test-${process.pid}`,
      memoryMiB: 96,
      scratchMiB: 8,
      totalMemoryMiB: 1024,
      warmInstances: 0,
    });
  });
  after(async () => {
    await provider.close();
    await rm(images, { recursive: true, force: true });
  });

  async function start(t: TestContext, id: string): Promise<{ current: MicrovmHandle }> {
    const live = { current: await provider.start({ microvmId: id, image: testImages.counter }) };
    t.after(() => provider.terminate(live.current, 200));
    return live;
  }

  /** Checkpoints into a fresh directory; asserts every process the instance had is gone. */
  async function checkpoint(handle: MicrovmHandle): Promise<string> {
    const pids = provider.cgroupOf(handle)?.pids() ?? [];
    assert.ok(pids.length > 0, "the live instance has processes in its cgroup");
    const dir = await mkdtemp(join(images, "image-"));
    await provider.checkpoint!(handle, dir);
    assert.deepEqual(
      pids.filter((pid) => !isGone(pid)),
      [],
      "a process of the checkpointed instance is left",
    );
    assert.deepEqual(instanceChildren(), [], "a wall of the checkpointed instance is left");
    assert.equal(await provider.isAlive(handle), false);
    return dir;
  }

  test("gvisor checkpoint - a restore answers with the memory and scratch file it had, no process between", async (t) => {
    const live = await start(t, "counter-once");
    for (let i = 0; i < 3; i += 1) await rpc(live.current, "increment");
    const before = await rpc<Counter>(live.current, "read");
    assert.deepEqual([before.memory, before.file], [3, 3]);
    const checkpointAt = Date.now();
    const dir = await checkpoint(live.current);
    const restoreAt = Date.now();
    live.current = await provider.restore!({ microvmId: "counter-once" }, dir);
    const bytes = (
      await Promise.all((await readdir(dir)).map(async (name) => (await stat(join(dir, name))).size))
    ).reduce((sum, size) => sum + size, 0);
    console.log(
      `# checkpoint ${restoreAt - checkpointAt} ms (with the checks), restore to answering ` +
        `${Date.now() - restoreAt} ms, image ${bytes} bytes`,
    );
    assert.deepEqual(await rpc<Counter>(live.current, "read"), before, "the restored instance lost its state");
    assert.equal(await rpc(live.current, "increment"), 4);
  });

  test("gvisor checkpoint - ten cycles keep counting in memory and in the file", async (t) => {
    const live = await start(t, "counter-cycles");
    const bornAt = (await rpc<Counter>(live.current, "read")).bornAt;
    for (let cycle = 1; cycle <= 10; cycle += 1) {
      await rpc(live.current, "increment");
      const dir = await checkpoint(live.current);
      live.current = await provider.restore!({ microvmId: "counter-cycles" }, dir);
      await rm(dir, { recursive: true });
      assert.deepEqual(
        await rpc<Counter>(live.current, "read"),
        { memory: cycle, file: cycle, bornAt },
        `cycle ${cycle}`,
      );
    }
  });

  test("gvisor checkpoint - a damaged image fails the restore with a MicrovmProviderError, in time", async (t) => {
    const live = await start(t, "counter-damaged");
    await rpc(live.current, "increment");
    const dir = await checkpoint(live.current);
    const files = await readdir(dir);
    const wallFiles = files.filter((name) => name !== "microvm-instance.json");
    assert.ok(wallFiles.length > 0, `the wall wrote its image (${files.join(", ")})`);
    // Every file the wall wrote is cut to half its size.
    for (const name of wallFiles) await truncate(join(dir, name), 16);
    const began = Date.now();
    await assert.rejects(provider.restore!({ microvmId: "counter-damaged" }, dir), (error: unknown) => {
      assert.ok(error instanceof MicrovmProviderError, String(error));
      assert.match(error.message, /could not be restored from its checkpoint/);
      return true;
    });
    assert.ok(Date.now() - began < 15_000, "the failed restore ended within its deadline");
    await assertNoInstanceLeft();
  });

  test("gvisor checkpoint - an image of another instance or without the host's file is refused", async (t) => {
    const live = await start(t, "counter-own");
    const dir = await checkpoint(live.current);
    await assert.rejects(provider.restore!({ microvmId: "counter-other" }, dir), /could not be restored/);
    await writeFile(join(dir, "microvm-instance.json"), "{");
    await assert.rejects(provider.restore!({ microvmId: "counter-own" }, dir), /could not be restored/);
  });
});

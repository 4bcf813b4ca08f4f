// Walls booted ahead and the CPU: a wall booting ahead of its instance (and waiting) runs at the
// background CPU weight, so a launch under way gets the cores first; a launch that takes it, or
// waits for its boot, gives it the default weight. The pool with walls of its own making, then
// the gVisor provider's walls read from their cgroups.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { CPU_SHARES, CPU_WEIGHT, type InstanceCgroup } from "../vm-runtime/host/cgroups.ts";
import type { Tracked, WallWeight } from "../vm-runtime/host/isolated-walls.ts";
import { warmPool } from "../vm-runtime/host/isolated-warm.ts";
import { pollUntil } from "../vm-runtime/host/provider-util.ts";
import { createGvisorProvider, type IsolatedProvider } from "../vm-runtime/service/index.ts";
import { gvisorSkip } from "./helpers/providers.ts";
import { assertNoInstanceLeft, cpuWeightOf, warmGroupsOf } from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";

/** A boot the test ends: its weight, the weights written to its group, and its wall. */
interface FakeBoot {
  readonly weight: WallWeight;
  readonly written: boolean[];
  readonly group: InstanceCgroup;
  /** Its wall, once its boot ended. */
  readonly entry: Tracked;
  /** Ends its boot: runsc runs the wall; `up`: its runtime printed its boot line too. */
  finish(up?: boolean): void;
}

function fakePool(target = 1) {
  const boots: FakeBoot[] = [];
  const pool = warmPool({
    target,
    heapMiB: 96,
    startTimeoutMs: 60_000,
    boot: (_heapMiB, _deadline, _signal, weight) =>
      new Promise<Tracked>((resolve) => {
        const written: boolean[] = [];
        const group = { weigh: async (background: boolean) => void written.push(background) } as InstanceCgroup;
        const entry = { done: false, cgroup: group, output: { booted: false } } as Tracked;
        boots.push({
          weight,
          written,
          group,
          entry,
          finish: (up = true) => {
            if (up) entry.output.booted = true;
            resolve(entry);
          },
        });
      }),
    stop: async () => undefined,
  });
  return { pool, boots };
}

describe("walls booted ahead - CPU weight in the pool", () => {
  it("walls - a launch that waits for a boot under way gives it the default weight before the boot ends", async () => {
    const { pool, boots } = fakePool();
    pool.refill();
    const [boot] = boots as [FakeBoot];
    assert.equal(boot.weight.background, true, "a wall booted ahead starts in the background");
    boot.weight.placed(boot.group);
    const taken = pool.take(96);
    await pollUntil(() => boot.written.length > 0, 5_000);
    assert.deepEqual(boot.written, [false], "raised while its boot is under way");
    boot.finish();
    assert.equal((await taken)?.cgroup, boot.group);
    assert.deepEqual(boot.written, [false], "written once");
    await pool.close(new Error("done"));
  });

  it("walls - a launch that waits before the wall's group is made has the group made at the default weight", async () => {
    const { pool, boots } = fakePool();
    pool.refill();
    const [boot] = boots as [FakeBoot];
    const taken = pool.take(96);
    await pollUntil(() => !boot.weight.background, 5_000);
    assert.equal(boot.weight.background, false);
    boot.weight.placed(boot.group);
    assert.deepEqual(boot.written, [false], "a raise before the group is written to it once made");
    boot.finish();
    assert.ok(await taken);
    await pool.close(new Error("done"));
  });

  it("walls - a wall is ready once its runtime printed its boot line, not once runsc runs it", async () => {
    const { pool, boots } = fakePool();
    pool.refill();
    const [boot] = boots as [FakeBoot];
    boot.finish(false);
    // The boot ended (the wall is handed over); node inside it has not said it is up.
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(pool.ready, 0, "a wall whose runtime is still starting is not ready");
    boot.entry.output.booted = true;
    assert.equal(pool.ready, 1, "ready once its boot line is read");
    await pool.close(new Error("done"));
  });

  it("walls - a launch takes a wall whose runtime is up before an older one still starting", async () => {
    const { pool, boots } = fakePool(2);
    pool.refill();
    const [older] = boots as [FakeBoot];
    older.finish(false);
    await new Promise((resolve) => setImmediate(resolve));
    const newer = boots[1]!;
    newer.finish(true);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(pool.ready, 1);
    assert.equal(await pool.take(96), newer.entry, "the one that is up");
    assert.equal(await pool.take(96), older.entry, "the one still starting, when no other waits");
    await pool.close(new Error("done"));
  });

  it("walls - are booted one at a time: the next once runsc runs the last, none after a failed one", async () => {
    const started: ((entry: Tracked | Error) => void)[] = [];
    const pool = warmPool({
      target: 3,
      heapMiB: 96,
      startTimeoutMs: 60_000,
      boot: () =>
        new Promise<Tracked>((resolve, reject) => {
          started.push((outcome) => (outcome instanceof Error ? reject(outcome) : resolve(outcome)));
        }),
      stop: async () => undefined,
    });
    const wall = () => ({ done: false, output: { booted: true } }) as Tracked;
    const settle = () => new Promise((resolve) => setImmediate(resolve));
    pool.refill();
    pool.refill();
    assert.equal(started.length, 1, "one boot under way, however often it is asked");
    started[0]!(wall());
    await settle();
    assert.equal(started.length, 2, "the next once the last one is up");
    started[1]!(new Error("boot failed"));
    await settle();
    assert.equal(started.length, 2, "none after a failed boot");
    pool.refill();
    assert.equal(started.length, 3, "the next start's refill boots again");
    started[2]!(wall());
    await settle();
    assert.equal(started.length, 4, "two up: the third boots");
    started[3]!(wall());
    await settle();
    assert.equal(started.length, 4, "three up: none more");
    assert.equal(pool.ready, 3);
    await pool.close(new Error("done"));
  });

  it("walls - another heap size takes no wall and leaves the pool's boot in the background", async () => {
    const { pool, boots } = fakePool();
    pool.refill();
    const [boot] = boots as [FakeBoot];
    boot.weight.placed(boot.group);
    assert.equal(await pool.take(128), undefined);
    assert.deepEqual(boot.written, []);
    boot.finish();
    await pool.close(new Error("done"));
  });
});

const skipGvisor = await gvisorSkip();

const commandOf = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "latin1").split("\0")[0]!;
  } catch {
    return "";
  }
};

describe("walls booted ahead - CPU weight on gVisor", { skip: skipGvisor }, () => {
  const hostKey = `walls-weight-${process.pid}`;
  let provider: IsolatedProvider;
  let weights: { readonly background: number; readonly normal: number };

  before(async () => {
    provider = await createGvisorProvider({
      hostKey,
      memoryMiB: 96,
      scratchMiB: 8,
      totalMemoryMiB: 1024,
      warmInstances: 1,
    });
    weights = provider.cgroupVersion === 1 ? CPU_SHARES : CPU_WEIGHT;
  });
  after(async () => {
    await provider.close();
    await assertNoInstanceLeft();
  });

  /** The group of the wall booted ahead once runsc's sandbox and gofer are in it. */
  async function bootedWall(other?: string): Promise<string> {
    let group: string | undefined;
    const booted = await pollUntil(() => {
      group = warmGroupsOf(hostKey).find((name) => name !== other);
      const commands = group ? cpuWeightOf(hostKey, group).pids.map(commandOf) : [];
      return commands.includes("runsc-sandbox") && commands.includes("runsc-gofer");
    }, 25_000);
    assert.ok(booted && group, "a wall is booted ahead, runsc's sandbox and gofer in its CPU group");
    return group;
  }

  it("walls (gvisor) - a wall waits at the background weight; the launch that takes it runs at the default one", async () => {
    await provider.prepare([testImages.probe]);
    const wall = await bootedWall();
    assert.equal(cpuWeightOf(hostKey, wall).weight, weights.background, "the wall booted ahead");
    const handle = await provider.start({ microvmId: "weighted", image: testImages.probe });
    try {
      const group = provider.cgroupOf(handle);
      assert.ok(group);
      const taken = cpuWeightOf(hostKey, group.name);
      assert.equal(taken.weight, weights.normal, "the instance that took the wall");
      assert.ok(taken.pids.map(commandOf).includes("runsc-sandbox"), "its sandbox in the group weighed");
      // The wall booted in its place waits in the background again.
      const next = await bootedWall(wall);
      assert.equal(cpuWeightOf(hostKey, next).weight, weights.background, "the wall booted in its place");
    } finally {
      await provider.terminate(handle, 200);
    }
  });
});

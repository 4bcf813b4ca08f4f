// Walls booted a few at a time: the slots' order, deadline and abort, and a burst of launches
// on the bubblewrap sandbox that never boots more walls at once than the host's slots, yet
// starts every instance.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { bootSlots } from "../vm-runtime/host/boot-slots.ts";
import { checkSandbox, createSandboxProvider, type IsolatedProvider } from "../vm-runtime/service/index.ts";
import { testImages } from "./images/paths.ts";

const late = (waitedMs: number) => new Error(`late after ${waitedMs} ms`);
const FAR = () => Date.now() + 60_000;

describe("boot slots", () => {
  it("boot slots - a slot is given at once while one is free, then in the order asked as each is released", async () => {
    const slots = bootSlots(2);
    const a = await slots.take(FAR(), undefined, late);
    const b = await slots.take(FAR(), undefined, late);
    const order: string[] = [];
    const c = slots.take(FAR(), undefined, late).then((slot) => (order.push("c"), slot));
    const d = slots.take(FAR(), undefined, late).then((slot) => (order.push("d"), slot));
    assert.deepEqual([slots.running, slots.waiting], [2, 2]);
    a.release();
    a.release(); // a second release frees nothing more
    const slotC = await c;
    assert.deepEqual([slots.running, slots.waiting, order], [2, 1, ["c"]]);
    b.release();
    const slotD = await d;
    assert.deepEqual(order, ["c", "d"]);
    slotC.release();
    slotD.release();
    assert.deepEqual([slots.running, slots.waiting], [0, 0]);
  });

  it("boot slots - a waiter past its deadline or aborted leaves the queue with its error; the next in line is served", async () => {
    const slots = bootSlots(1);
    const held = await slots.take(FAR(), undefined, late);
    await assert.rejects(slots.take(Date.now() + 20, undefined, late), /^Error: late after \d+ ms$/);
    const controller = new AbortController();
    const aborted = slots.take(FAR(), controller.signal, late);
    const next = slots.take(FAR(), undefined, late);
    controller.abort(new Error("caller gone"));
    await assert.rejects(aborted, /caller gone/);
    assert.equal(slots.waiting, 1);
    held.release();
    (await next).release();
    assert.deepEqual([slots.running, slots.waiting], [0, 0]);
    await assert.rejects(slots.take(FAR(), AbortSignal.abort(new Error("already")), late), /already/);
    assert.throws(() => bootSlots(0), RangeError);
  });
});

const sandbox = await checkSandbox();
describe("boot slots on the sandbox", { skip: sandbox.ok ? false : sandbox.reason }, () => {
  let provider: IsolatedProvider;
  before(async () => {
    provider = await createSandboxProvider({
      hostKey: `boot-slots-${process.pid}`,
      bootSlots: 1,
      warmInstances: 0,
      memoryMiB: 96,
      scratchMiB: 8,
    });
    await provider.prepare([testImages.counter]);
  });
  after(() => provider?.close());

  it("boot slots - a burst of launches on one slot boots one wall at a time and starts them all", async () => {
    let maxRunning = 0;
    let maxWaiting = 0;
    const sample = () => {
      const { running, waiting } = provider.boots();
      maxRunning = Math.max(maxRunning, running);
      maxWaiting = Math.max(maxWaiting, waiting);
    };
    const sampler = setInterval(sample, 1);
    const handles = await Promise.all(
      ["s0", "s1", "s2"].map((microvmId) => provider.start({ microvmId, image: testImages.counter })),
    ).finally(() => clearInterval(sampler));
    try {
      assert.equal(handles.length, 3);
      assert.equal(maxRunning, 1, "walls booting at once");
      assert.ok(maxWaiting >= 1, `launches waited for the slot (at most ${maxWaiting} at once)`);
      assert.deepEqual(provider.boots(), { running: 0, waiting: 0, ready: 0 });
    } finally {
      await Promise.all(handles.map((handle) => provider.terminate(handle, 200)));
    }
  });
});

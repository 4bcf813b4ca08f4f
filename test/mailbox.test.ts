// Per-key mailboxes: one piece of work at a time per key, in order, failures included.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Mailboxes } from "../actors/index.ts";

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("mailbox", () => {
  it("mailbox - work for one key runs one at a time, in arrival order", async () => {
    const boxes = new Mailboxes();
    const log: string[] = [];
    let running = 0;
    let most = 0;
    const work = (name: string, ms: number) => async () => {
      running++;
      most = Math.max(most, running);
      log.push(`start ${name}`);
      await tick(ms);
      log.push(`end ${name}`);
      running--;
      return name;
    };
    const results = await Promise.all([
      boxes.run("k", work("a", 20)),
      boxes.run("k", work("b", 1)),
      boxes.run("k", work("c", 5)),
    ]);
    assert.deepEqual(results, ["a", "b", "c"]);
    assert.equal(most, 1);
    assert.deepEqual(log, ["start a", "end a", "start b", "end b", "start c", "end c"]);
    assert.equal(boxes.size, 0, "idle keys hold nothing");
  });

  it("mailbox - different keys run concurrently", async () => {
    const boxes = new Mailboxes();
    let running = 0;
    let most = 0;
    const work = async () => {
      running++;
      most = Math.max(most, running);
      await tick(10);
      running--;
    };
    await Promise.all(["a", "b", "c"].map((k) => boxes.run(k, work)));
    assert.equal(most, 3);
  });

  it("mailbox - a failure rejects its caller and the next work still runs", async () => {
    const boxes = new Mailboxes();
    const failing = boxes.run("k", async () => {
      throw new Error("boom");
    });
    const throwingSync = boxes.run("k", (() => {
      throw new Error("sync boom");
    }) as () => Promise<never>);
    const after = boxes.run("k", async () => "after");
    await assert.rejects(failing, /boom/);
    await assert.rejects(throwingSync, /sync boom/);
    assert.equal(await after, "after");
    assert.equal(boxes.size, 0);
  });
});

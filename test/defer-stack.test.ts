// The microVM host's start unwinds through one defer stack: these pin down its order and its
// failures.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DeferStack } from "../vm-runtime/service/defer-stack.ts";

test("defer stack - unwind runs every step once, last deferred first", async () => {
  const undo = new DeferStack();
  const ran: string[] = [];
  undo.defer(() => ran.push("lock"));
  undo.defer(async () => void ran.push("provider"));
  undo.defer(() => ran.push("watch"));
  await undo.unwind();
  await undo.unwind();
  assert.deepEqual(ran, ["watch", "provider", "lock"]);
});

test("defer stack - a failing step does not stop the others, and its failure is the answer", async () => {
  const undo = new DeferStack();
  const ran: string[] = [];
  undo.defer(() => ran.push("lock"));
  undo.defer(() => {
    throw new Error("provider did not close");
  });
  await assert.rejects(undo.unwind(), /provider did not close/);
  assert.deepEqual(ran, ["lock"]);
});

test("defer stack - a failed start unwinds what it made and rejects with its own failure", async () => {
  const undo = new DeferStack();
  const ran: string[] = [];
  const start = undo.unwindOnFailure(async () => {
    undo.defer(() => ran.push("lock"));
    undo.defer(() => {
      throw new Error("cleanup failed too");
    });
    throw new Error("images did not open");
  });
  await assert.rejects(start, /images did not open/);
  assert.deepEqual(ran, ["lock"]);
  assert.equal(await undo.unwindOnFailure(async () => "served"), "served");
});

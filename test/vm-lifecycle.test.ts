// Tests of the instance lifecycle machine: each transition, the idle policy, deadlines,
// refusals an operation maps to 409, and the persisted-snapshot round trip.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { createActor, fromPromise, waitFor } from "xstate";
import {
  canAccept,
  isResuming,
  lifecycleMachine,
  microvmState,
  restoreLifecycle,
  type LifecycleActor,
  type LifecycleTimeouts,
  type MicrovmHandle,
  type MicrovmState,
} from "../vm-runtime/index.ts";

const handle: MicrovmHandle = {
  microvmId: "vm-1",
  provider: "test",
  host: "127.0.0.1",
  ports: { "8080": 1234 },
  startedAt: "2025-01-01T00:00:00.000Z",
};

interface Io {
  start?: (signal: AbortSignal) => Promise<MicrovmHandle>;
  suspend?: () => Promise<void>;
  resume?: () => Promise<void>;
  terminate?: () => Promise<void>;
}

interface Harness {
  readonly actor: LifecycleActor;
  readonly calls: string[];
  readonly machine: ReturnType<typeof machineWith>;
  state(): MicrovmState;
  reach(state: MicrovmState, timeoutMs?: number): Promise<void>;
}

function deferred<T = void>() {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function machineWith(io: Io, calls: string[]) {
  return lifecycleMachine.provide({
    actors: {
      start: fromPromise(({ signal }) => {
        calls.push("start");
        return io.start ? io.start(signal) : Promise.resolve(handle);
      }),
      suspend: fromPromise(async ({ input }) => {
        calls.push(`suspend:${input.handle.microvmId}`);
        await io.suspend?.();
      }),
      resume: fromPromise(async () => {
        calls.push("resume");
        await io.resume?.();
      }),
      terminate: fromPromise(async ({ input }) => {
        calls.push(`terminate:${input.handle?.microvmId ?? "none"}:${input.graceMs}`);
        await io.terminate?.();
      }),
    },
  });
}

function harness(
  t: TestContext,
  options: { idle?: number; suspended?: number; timeouts?: Partial<LifecycleTimeouts>; io?: Io } = {},
): Harness {
  const calls: string[] = [];
  const machine = machineWith(options.io ?? {}, calls);
  const actor = createActor(machine, {
    input: {
      microvmId: "vm-1",
      idlePolicy: { maxIdleDurationSeconds: options.idle ?? 60, suspendedDurationSeconds: options.suspended ?? 60, autoResumeEnabled: true },
      timeouts: { terminateGraceMs: 7, ...options.timeouts },
    },
  });
  actor.start();
  t.after(() => actor.stop());
  return {
    actor,
    calls,
    machine,
    state: () => microvmState(actor.getSnapshot()),
    async reach(state, timeoutMs = 2_000) {
      await waitFor(actor, (snapshot) => microvmState(snapshot) === state, { timeout: timeoutMs });
    },
  };
}

test("lifecycle - PENDING until start resolves, then RUNNING with the handle", async (t) => {
  const started = deferred<MicrovmHandle>();
  const h = harness(t, { io: { start: () => started.promise } });
  assert.equal(h.state(), "PENDING");
  assert.ok(!Number.isNaN(Date.parse(h.actor.getSnapshot().context.startedAt)), "startedAt is the launch time");
  await sleep(20);
  assert.equal(h.state(), "PENDING");
  started.resolve(handle);
  await h.reach("RUNNING");
  assert.deepEqual(h.actor.getSnapshot().context.handle, handle);
  assert.equal(h.actor.getSnapshot().context.stateReason, undefined);
});

test("lifecycle - a failed start is FAILED with the cause in stateReason", async (t) => {
  const h = harness(t, { io: { start: () => Promise.reject(new Error("image not found")) } });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "StartFailed: image not found");
});

test("lifecycle - a start past its deadline is FAILED and the start is aborted", async (t) => {
  let aborted = false;
  const h = harness(t, {
    timeouts: { startMs: 40 },
    io: {
      start: (signal) => {
        signal.addEventListener("abort", () => (aborted = true));
        return new Promise(() => undefined);
      },
    },
  });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "StartTimedOut");
  assert.equal(aborted, true);
});

test("lifecycle - idle for maxIdleDurationSeconds suspends", async (t) => {
  const h = harness(t, { idle: 0.05 });
  let suspendingAt = 0;
  h.actor.subscribe((snapshot) => {
    if (!suspendingAt && microvmState(snapshot) === "SUSPENDING") suspendingAt = Date.now();
  });
  await h.reach("RUNNING");
  const idleSince = h.actor.getSnapshot().context.timerAnchor;
  await h.reach("SUSPENDED");
  assert.ok(suspendingAt - idleSince >= 48, `suspended after ${suspendingAt - idleSince} ms idle`);
  assert.equal(h.actor.getSnapshot().context.stateReason, "IdleTimeout");
  assert.deepEqual(h.calls, ["start", "suspend:vm-1"]);
});

test("lifecycle - SUSPENDING is reported while the suspend runs", async (t) => {
  const suspended = deferred();
  const h = harness(t, { idle: 0.01, io: { suspend: () => suspended.promise } });
  await h.reach("SUSPENDING");
  suspended.resolve();
  await h.reach("SUSPENDED");
});

test("lifecycle - ACTIVITY restarts the idle clock", async (t) => {
  const h = harness(t, { idle: 0.1 });
  await h.reach("RUNNING");
  for (let i = 0; i < 6; i++) {
    await sleep(40);
    h.actor.send({ type: "ACTIVITY" });
  }
  assert.equal(h.state(), "RUNNING");
  await h.reach("SUSPENDED");
});

test("lifecycle - requests in flight keep it running; the idle clock starts when the last ends", async (t) => {
  const h = harness(t, { idle: 0.05 });
  await h.reach("RUNNING");
  h.actor.send({ type: "REQUEST_START", inFlight: 1 });
  h.actor.send({ type: "REQUEST_START", inFlight: 2 });
  h.actor.send({ type: "REQUEST_END", inFlight: 1 });
  await sleep(150);
  assert.equal(h.state(), "RUNNING");
  assert.equal(h.actor.getSnapshot().context.inFlight, 1);
  const endedAt = Date.now();
  h.actor.send({ type: "REQUEST_END", inFlight: 0 });
  await h.reach("SUSPENDED");
  assert.ok(Date.now() - endedAt >= 45, "suspended before the idle duration after the last request");
});

test("lifecycle - suspended for suspendedDurationSeconds terminates", async (t) => {
  const h = harness(t, { idle: 0.01, suspended: 0.05 });
  await h.reach("SUSPENDED");
  await h.reach("TERMINATED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendedDurationElapsed");
  assert.equal(h.actor.getSnapshot().context.handle, undefined);
  assert.deepEqual(h.calls, ["start", "suspend:vm-1", "terminate:vm-1:7"]);
  assert.equal(h.actor.getSnapshot().status, "done");
});

test("lifecycle - RESUME reports SUSPENDED while resuming, then RUNNING", async (t) => {
  const resumed = deferred();
  const h = harness(t, { io: { resume: () => resumed.promise } });
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  assert.equal(h.state(), "SUSPENDED");
  assert.equal(isResuming(h.actor.getSnapshot()), true);
  assert.equal(canAccept(h.actor.getSnapshot(), { type: "RESUME" }), true, "a second RESUME while resuming is accepted");
  resumed.resolve();
  await h.reach("RUNNING");
  assert.equal(isResuming(h.actor.getSnapshot()), false);
  assert.equal(h.actor.getSnapshot().context.stateReason, undefined);
});

test("lifecycle - SUSPEND from RUNNING suspends with a reason", async (t) => {
  const h = harness(t);
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendRequested");
});

test("lifecycle - TERMINATE from RUNNING terminates with the handle and grace", async (t) => {
  const h = harness(t);
  await h.reach("RUNNING");
  h.actor.send({ type: "TERMINATE" });
  assert.equal(h.state(), "TERMINATING");
  await h.reach("TERMINATED");
  assert.deepEqual(h.calls, ["start", "terminate:vm-1:7"]);
  assert.equal(h.actor.getSnapshot().context.stateReason, "TerminateRequested");
});

test("lifecycle - TERMINATE while PENDING aborts the start and terminates", async (t) => {
  let aborted = false;
  const h = harness(t, {
    io: {
      start: (signal) => {
        signal.addEventListener("abort", () => (aborted = true));
        return new Promise(() => undefined);
      },
    },
  });
  h.actor.send({ type: "TERMINATE", reason: "Cancelled" });
  await h.reach("TERMINATED");
  assert.equal(aborted, true);
  assert.deepEqual(h.calls, ["start", "terminate:none:7"]);
  assert.equal(h.actor.getSnapshot().context.stateReason, "Cancelled");
});

test("lifecycle - invalid transitions are detectable (an operation answers 409)", async (t) => {
  const h = harness(t);
  await h.reach("RUNNING");
  const can = (type: "SUSPEND" | "RESUME" | "TERMINATE") => canAccept(h.actor.getSnapshot(), { type });
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [true, false, true]);
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [false, true, true]);
  h.actor.send({ type: "TERMINATE" });
  assert.equal(h.state(), "TERMINATING");
  assert.equal(can("TERMINATE"), true, "a repeated TERMINATE while terminating is accepted");
  await h.reach("TERMINATED");
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [false, false, false]);
});

test("lifecycle - a suspend past its deadline is FAILED", async (t) => {
  const h = harness(t, { timeouts: { suspendMs: 40 }, io: { suspend: () => new Promise(() => undefined) } });
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendTimedOut");
});

test("lifecycle - a failed suspend is FAILED with the cause", async (t) => {
  const h = harness(t, { io: { suspend: () => Promise.reject(new Error("no such process")) } });
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendFailed: no such process");
});

test("lifecycle - a resume past its deadline is FAILED", async (t) => {
  const h = harness(t, { timeouts: { resumeMs: 40 }, io: { resume: () => new Promise(() => undefined) } });
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "ResumeTimedOut");
});

test("lifecycle - a terminate past its deadline is FAILED, and FAILED still accepts TERMINATE", async (t) => {
  let attempts = 0;
  const h = harness(t, {
    timeouts: { terminateMs: 40 },
    io: { terminate: () => (++attempts === 1 ? new Promise(() => undefined) : Promise.resolve()) },
  });
  await h.reach("RUNNING");
  h.actor.send({ type: "TERMINATE" });
  await h.reach("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "TerminateTimedOut");
  assert.equal(canAccept(h.actor.getSnapshot(), { type: "TERMINATE" }), true);
  assert.equal(canAccept(h.actor.getSnapshot(), { type: "RESUME" }), false);
  h.actor.send({ type: "TERMINATE" });
  await h.reach("TERMINATED");
  assert.equal(attempts, 2);
});

test("lifecycle - idle and suspended durations of 0 disable those timers", async (t) => {
  const h = harness(t, { idle: 0, suspended: 0 });
  await h.reach("RUNNING");
  await sleep(60);
  assert.equal(h.state(), "RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  await sleep(60);
  assert.equal(h.state(), "SUSPENDED");
});

test("lifecycle - the persisted snapshot round-trips through JSON", async (t) => {
  const h = harness(t);
  await h.reach("RUNNING");
  h.actor.send({ type: "REQUEST_START", inFlight: 1 });
  h.actor.send({ type: "REQUEST_END", inFlight: 0 });
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  const persisted = JSON.parse(JSON.stringify(h.actor.getPersistedSnapshot())) as unknown;
  const before = h.actor.getSnapshot();
  h.actor.stop();

  const restored = createActor(h.machine, { snapshot: persisted as typeof before, input: { microvmId: "ignored", idlePolicy: before.context.idlePolicy } });
  restored.start();
  t.after(() => restored.stop());
  assert.equal(microvmState(restored.getSnapshot()), "SUSPENDED");
  assert.deepEqual(restored.getSnapshot().value, before.value);
  assert.deepEqual(restored.getSnapshot().context, before.context);
  restored.send({ type: "RESUME" });
  await waitFor(restored, (snapshot) => microvmState(snapshot) === "RUNNING", { timeout: 2_000 });
  assert.deepEqual(h.calls, ["start", "suspend:vm-1", "resume"]);
});

test("lifecycle - a restored machine keeps its timers' original deadlines", async (t) => {
  const h = harness(t, { suspended: 0.6 });
  await h.reach("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.reach("SUSPENDED");
  await sleep(400);
  const persisted = JSON.parse(JSON.stringify(h.actor.getPersistedSnapshot())) as unknown;
  h.actor.stop();
  const restoredAt = Date.now();
  const restored = restoreLifecycle(h.machine, persisted);
  t.after(() => restored.stop());
  await waitFor(restored, (snapshot) => microvmState(snapshot) === "TERMINATED", { timeout: 2_000 });
  const waited = Date.now() - restoredAt;
  assert.ok(waited < 520, `timer restarted from scratch (${waited} ms of 600)`);
  assert.equal(restored.getSnapshot().context.stateReason, "SuspendedDurationElapsed");
});

test("lifecycle - a restored RUNNING machine still suspends when idle", async (t) => {
  const h = harness(t, { idle: 0.1 });
  await h.reach("RUNNING");
  const persisted = JSON.parse(JSON.stringify(h.actor.getPersistedSnapshot())) as unknown;
  h.actor.stop();
  const restored = restoreLifecycle(h.machine, persisted);
  t.after(() => restored.stop());
  await waitFor(restored, (snapshot) => microvmState(snapshot) === "SUSPENDED", { timeout: 2_000 });
  assert.equal(restored.getSnapshot().context.stateReason, "IdleTimeout");
});

// Tests of the instance lifecycle machine: each transition, the idle policy, deadlines,
// refusals an operation maps to 409, and the persisted-snapshot round trip. Time is mocked
// (setTimeout and Date): a test advances the clock to a millisecond and asserts the snapshot.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { setImmediate as macrotask } from "node:timers/promises";
import { createActor, fromPromise } from "xstate";
import {
  canAccept,
  lifecycleMachine,
  microvmState,
  SuspendRefused,
  type LifecycleActor,
  type LifecycleTimeouts,
  type MicrovmHandle,
  type SavedSnapshot,
} from "../vm-runtime/service/index.ts";
import type { MicrovmState } from "../schemas/index.ts";
import { StateReason } from "../vm-runtime/index.ts";

const handle: MicrovmHandle = {
  microvmId: "vm-1",
  provider: "test",
  host: "127.0.0.1",
  ports: { "8080": 1234 },
  startedAt: "2025-01-01T00:00:00.000Z",
};

const saved: SavedSnapshot = { digest: "sha256:1", bytes: 10, createdAt: "2025-01-01T00:00:00.000Z" };
const restored: MicrovmHandle = { ...handle, ports: { "8080": 5678 } };

interface Io {
  start?: (signal: AbortSignal) => Promise<MicrovmHandle>;
  suspend?: () => Promise<void>;
  resume?: () => Promise<void>;
  terminate?: () => Promise<void>;
  checkpoint?: () => Promise<SavedSnapshot>;
  restore?: (saved: SavedSnapshot) => Promise<MicrovmHandle>;
}

interface Harness {
  readonly actor: LifecycleActor;
  readonly calls: string[];
  readonly machine: ReturnType<typeof machineWith>;
  state(): MicrovmState;
  /** Asserts the state once the I/O promises already settled have been handled. */
  expect(state: MicrovmState): Promise<void>;
  /** Moves the mocked clock on by `ms`, firing due timers, then lets the I/O promises settle. */
  advance(ms: number): Promise<void>;
}

/** Past the longest timer Node arms (2^31-1 ms): a disabled timer would have fired by then. */
const LONGER_THAN_ANY_TIMER_MS = 2 ** 31;

/** Lets settled promise chains run (the machine's I/O actors answer in microtasks). */
const settle = () => macrotask();

/** Mocks setTimeout (XState's default clock) and Date (the machine's timer anchor) for one test. */
function mockClock(t: TestContext): void {
  t.mock.timers.enable({ apis: ["setTimeout", "Date"], now: Date.parse("2025-01-01T00:00:00.000Z") });
}

async function advance(t: TestContext, ms: number): Promise<void> {
  t.mock.timers.tick(ms);
  await settle();
}

async function expectState(actor: LifecycleActor, state: MicrovmState): Promise<void> {
  await settle();
  assert.equal(microvmState(actor.getSnapshot()), state);
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
      checkpoint: fromPromise(async ({ input }) => {
        calls.push(`checkpoint:${input.handle.microvmId}`);
        return io.checkpoint ? io.checkpoint() : saved;
      }),
      restore: fromPromise(async ({ input }) => {
        calls.push(`restore:${input.saved.digest}`);
        return io.restore ? io.restore(input.saved) : restored;
      }),
    },
  });
}

function harness(
  t: TestContext,
  options: {
    idle?: number;
    suspended?: number;
    timeouts?: Partial<LifecycleTimeouts>;
    io?: Io;
    checkpoints?: boolean;
  } = {},
): Harness {
  mockClock(t);
  const calls: string[] = [];
  const machine = machineWith(options.io ?? {}, calls);
  const actor = createActor(machine, {
    input: {
      microvmId: "vm-1",
      idlePolicy: {
        maxIdleDurationSeconds: options.idle ?? 60,
        suspendedDurationSeconds: options.suspended ?? 60,
        autoResumeEnabled: true,
      },
      timeouts: { terminateGraceMs: 7, ...options.timeouts },
      checkpoints: options.checkpoints ?? false,
    },
  });
  actor.start();
  t.after(() => actor.stop());
  return {
    actor,
    calls,
    machine,
    state: () => microvmState(actor.getSnapshot()),
    expect: (state) => expectState(actor, state),
    advance: (ms) => advance(t, ms),
  };
}

test("lifecycle - PENDING until start resolves, then RUNNING with the handle", async (t) => {
  const started = deferred<MicrovmHandle>();
  const h = harness(t, { io: { start: () => started.promise } });
  assert.equal(h.state(), "PENDING");
  assert.ok(!Number.isNaN(Date.parse(h.actor.getSnapshot().context.startedAt)), "startedAt is the launch time");
  await h.advance(20_000);
  assert.equal(h.state(), "PENDING");
  started.resolve(handle);
  await h.expect("RUNNING");
  assert.deepEqual(h.actor.getSnapshot().context.handle, handle);
  assert.equal(h.actor.getSnapshot().context.stateReason, undefined);
});

test("lifecycle - a failed start is FAILED with the cause in stateReason", async (t) => {
  const h = harness(t, { io: { start: () => Promise.reject(new Error("image not found")) } });
  await h.expect("FAILED");
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
  await h.advance(39);
  assert.equal(h.state(), "PENDING");
  assert.equal(aborted, false);
  await h.advance(1);
  assert.equal(h.state(), "FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "StartTimedOut");
  assert.equal(aborted, true);
});

test("lifecycle - idle for maxIdleDurationSeconds suspends", async (t) => {
  const h = harness(t, { idle: 0.05 });
  await h.expect("RUNNING");
  await h.advance(49);
  assert.equal(h.state(), "RUNNING", "not suspended before 50 ms idle");
  await h.advance(1);
  assert.equal(h.state(), "SUSPENDED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "IdleTimeout");
  assert.deepEqual(h.calls, ["start", "suspend:vm-1"]);
});

test("lifecycle - SUSPENDING is reported while the suspend runs", async (t) => {
  const suspended = deferred();
  const h = harness(t, { idle: 0.01, io: { suspend: () => suspended.promise } });
  await h.expect("RUNNING");
  await h.advance(10);
  assert.equal(h.state(), "SUSPENDING");
  suspended.resolve();
  await h.expect("SUSPENDED");
});

test("lifecycle - a request that ends restarts the idle clock", async (t) => {
  const h = harness(t, { idle: 0.1 });
  await h.expect("RUNNING");
  for (let i = 0; i < 6; i++) {
    await h.advance(40);
    h.actor.send({ type: "REQUEST_START", inFlight: 1 });
    h.actor.send({ type: "REQUEST_END", inFlight: 0 });
  }
  assert.equal(h.state(), "RUNNING", "240 ms of activity every 40 ms with a 100 ms idle limit");
  await h.advance(99);
  assert.equal(h.state(), "RUNNING", "the clock restarted when the last request ended");
  await h.advance(1);
  assert.equal(h.state(), "SUSPENDED");
});

test("lifecycle - requests in flight keep it running; the idle clock starts when the last ends", async (t) => {
  const h = harness(t, { idle: 0.05 });
  await h.expect("RUNNING");
  h.actor.send({ type: "REQUEST_START", inFlight: 1 });
  h.actor.send({ type: "REQUEST_START", inFlight: 2 });
  h.actor.send({ type: "REQUEST_END", inFlight: 1 });
  await h.advance(150);
  assert.equal(h.state(), "RUNNING");
  assert.equal(h.actor.getSnapshot().context.inFlight, 1);
  h.actor.send({ type: "REQUEST_END", inFlight: 0 });
  await h.advance(49);
  assert.equal(h.state(), "RUNNING", "suspended before the idle duration after the last request");
  await h.advance(1);
  assert.equal(h.state(), "SUSPENDED");
});

test("lifecycle - suspended for suspendedDurationSeconds terminates", async (t) => {
  const h = harness(t, { idle: 0.01, suspended: 0.05 });
  await h.expect("RUNNING");
  await h.advance(10);
  assert.equal(h.state(), "SUSPENDED");
  await h.advance(49);
  assert.equal(h.state(), "SUSPENDED");
  await h.advance(1);
  assert.equal(h.state(), "TERMINATED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendedDurationElapsed");
  assert.equal(h.actor.getSnapshot().context.handle, undefined);
  assert.deepEqual(h.calls, ["start", "suspend:vm-1", "terminate:vm-1:7"]);
  assert.equal(h.actor.getSnapshot().status, "done");
});

test("lifecycle - RESUME reports SUSPENDED while resuming, then RUNNING", async (t) => {
  const resumed = deferred();
  const h = harness(t, { io: { resume: () => resumed.promise } });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  assert.equal(h.state(), "SUSPENDED");
  assert.equal(h.actor.getSnapshot().matches({ SUSPENDED: "resuming" }), true);
  assert.equal(
    canAccept(h.actor.getSnapshot(), { type: "RESUME" }),
    true,
    "a second RESUME while resuming is accepted",
  );
  resumed.resolve();
  await h.expect("RUNNING");
  assert.equal(h.actor.getSnapshot().matches({ SUSPENDED: "resuming" }), false);
  assert.equal(h.actor.getSnapshot().context.stateReason, undefined);
});

test("lifecycle - SUSPEND from RUNNING suspends with a reason", async (t) => {
  const h = harness(t);
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendRequested");
});

test("lifecycle - TERMINATE from RUNNING terminates with the handle and grace", async (t) => {
  const h = harness(t);
  await h.expect("RUNNING");
  h.actor.send({ type: "TERMINATE" });
  assert.equal(h.state(), "TERMINATING");
  await h.expect("TERMINATED");
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
  h.actor.send({ type: "TERMINATE", reason: StateReason.HostShutdown });
  await h.expect("TERMINATED");
  assert.equal(aborted, true);
  assert.deepEqual(h.calls, ["start", "terminate:none:7"]);
  assert.equal(h.actor.getSnapshot().context.stateReason, "HostShutdown");
});

test("lifecycle - invalid transitions are detectable (an operation answers 409)", async (t) => {
  const h = harness(t);
  await h.expect("RUNNING");
  const can = (type: "SUSPEND" | "RESUME" | "TERMINATE") => canAccept(h.actor.getSnapshot(), { type });
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [true, false, true]);
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [false, true, true]);
  h.actor.send({ type: "TERMINATE" });
  assert.equal(h.state(), "TERMINATING");
  assert.equal(can("TERMINATE"), true, "a repeated TERMINATE while terminating is accepted");
  await h.expect("TERMINATED");
  assert.deepEqual([can("SUSPEND"), can("RESUME"), can("TERMINATE")], [false, false, false]);
});

test("lifecycle - a suspend past its deadline is FAILED", async (t) => {
  const h = harness(t, { timeouts: { suspendMs: 40 }, io: { suspend: () => new Promise(() => undefined) } });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.advance(39);
  assert.equal(h.state(), "SUSPENDING");
  await h.advance(1);
  assert.equal(h.state(), "FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendTimedOut");
});

test("lifecycle - a failed suspend is FAILED with the cause", async (t) => {
  const h = harness(t, { io: { suspend: () => Promise.reject(new Error("no such process")) } });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "SuspendFailed: no such process");
});

test("lifecycle - a resume past its deadline is FAILED", async (t) => {
  const h = harness(t, { timeouts: { resumeMs: 40 }, io: { resume: () => new Promise(() => undefined) } });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  await h.advance(39);
  assert.equal(h.state(), "SUSPENDED");
  assert.equal(h.actor.getSnapshot().matches({ SUSPENDED: "resuming" }), true);
  await h.advance(1);
  assert.equal(h.state(), "FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "ResumeTimedOut");
});

test("lifecycle - a terminate past its deadline is FAILED, and FAILED still accepts TERMINATE", async (t) => {
  let attempts = 0;
  const h = harness(t, {
    timeouts: { terminateMs: 40 },
    io: { terminate: () => (++attempts === 1 ? new Promise(() => undefined) : Promise.resolve()) },
  });
  await h.expect("RUNNING");
  h.actor.send({ type: "TERMINATE" });
  await h.advance(39);
  assert.equal(h.state(), "TERMINATING");
  await h.advance(1);
  assert.equal(h.state(), "FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "TerminateTimedOut");
  assert.equal(canAccept(h.actor.getSnapshot(), { type: "TERMINATE" }), true);
  assert.equal(canAccept(h.actor.getSnapshot(), { type: "RESUME" }), false);
  h.actor.send({ type: "TERMINATE" });
  await h.expect("TERMINATED");
  assert.equal(attempts, 2);
});

test("lifecycle - idle and suspended durations of 0 disable those timers", async (t) => {
  const h = harness(t, { idle: 0, suspended: 0 });
  await h.expect("RUNNING");
  await h.advance(LONGER_THAN_ANY_TIMER_MS);
  assert.equal(h.state(), "RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  await h.advance(LONGER_THAN_ANY_TIMER_MS);
  assert.equal(h.state(), "SUSPENDED");
});

test("lifecycle - the persisted snapshot round-trips through JSON", async (t) => {
  const h = harness(t);
  await h.expect("RUNNING");
  h.actor.send({ type: "REQUEST_START", inFlight: 1 });
  h.actor.send({ type: "REQUEST_END", inFlight: 0 });
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  const persisted = JSON.parse(JSON.stringify(h.actor.getPersistedSnapshot())) as unknown;
  const before = h.actor.getSnapshot();
  h.actor.stop();

  const restored = createActor(h.machine, {
    snapshot: persisted as typeof before,
    input: { microvmId: "ignored", idlePolicy: before.context.idlePolicy },
  });
  restored.start();
  t.after(() => restored.stop());
  assert.equal(microvmState(restored.getSnapshot()), "SUSPENDED");
  assert.deepEqual(restored.getSnapshot().value, before.value);
  assert.deepEqual(restored.getSnapshot().context, before.context);
  restored.send({ type: "RESUME" });
  await expectState(restored, "RUNNING");
  assert.deepEqual(h.calls, ["start", "suspend:vm-1", "resume"]);
});

test("lifecycle - with checkpoints, suspend stores a snapshot in place of the handle and resume restores it", async (t) => {
  const checkpointed = deferred<SavedSnapshot>();
  const h = harness(t, { checkpoints: true, io: { checkpoint: () => checkpointed.promise } });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  assert.deepEqual(h.actor.getSnapshot().value, { SUSPENDING: { checkpointing: "moving" } });
  checkpointed.resolve(saved);
  await h.expect("SUSPENDED");
  const asleep = h.actor.getSnapshot().context;
  assert.deepEqual([asleep.saved, asleep.handle], [saved, undefined]);
  // The persisted snapshot keeps what a restore needs.
  const copy = createActor(h.machine, {
    snapshot: h.actor.getPersistedSnapshot(),
    input: h.actor.getSnapshot().context,
  });
  assert.deepEqual(copy.getSnapshot().context.saved, saved);
  h.actor.send({ type: "RESUME" });
  assert.deepEqual(h.actor.getSnapshot().value, { SUSPENDED: { restoring: "moving" } });
  assert.equal(h.actor.getSnapshot().context.stateReason, "Resuming");
  await h.expect("RUNNING");
  const running = h.actor.getSnapshot().context;
  assert.deepEqual([running.handle, running.saved], [restored, undefined]);
  assert.deepEqual(h.calls, ["start", "checkpoint:vm-1", `restore:${saved.digest}`]);
});

test("lifecycle - with checkpoints, idle suspends by a checkpoint", async (t) => {
  const h = harness(t, { checkpoints: true, idle: 0.05 });
  await h.expect("RUNNING");
  await h.advance(50);
  assert.equal(h.state(), "SUSPENDED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "IdleTimeout");
  assert.deepEqual(h.calls, ["start", "checkpoint:vm-1"]);
});

test("lifecycle - a failed checkpoint ends in FAILED with the reason", async (t) => {
  const h = harness(t, {
    checkpoints: true,
    io: { checkpoint: () => Promise.reject(new Error("instance vm-1 could not be checkpointed")) },
  });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "CheckpointFailed: instance vm-1 could not be checkpointed");
});

for (const [refusedWith, which] of [
  [restored, "the handle it names (restored)"],
  [undefined, "its own handle (refused before the checkpoint)"],
] as const) {
  test(`lifecycle - a refused checkpoint (SuspendRefused) runs on, with ${which}`, async (t) => {
    const h = harness(t, {
      checkpoints: true,
      io: { checkpoint: () => Promise.reject(new SuspendRefused("over the quota", 1024, refusedWith)) },
    });
    await h.expect("RUNNING");
    h.actor.send({ type: "SUSPEND" });
    assert.equal(h.state(), "SUSPENDING");
    await h.expect("RUNNING");
    const { context } = h.actor.getSnapshot();
    assert.deepEqual(
      [context.handle, context.suspendRefused],
      [refusedWith ?? handle, { message: "over the quota", quota: 1024 }],
    );
    assert.equal(context.saved, undefined);
  });
}

/** Three times nearly a snapshot step's 30 ms deadline, each ended by progress. */
async function progressing(h: Harness): Promise<void> {
  for (let i = 0; i < 3; i++) {
    await h.advance(29);
    h.actor.send({ type: "SNAPSHOT_PROGRESS" });
  }
}

test("lifecycle - a checkpoint past its deadline, counted from its last progress, ends in FAILED", async (t) => {
  const h = harness(t, {
    checkpoints: true,
    timeouts: { checkpointMs: 30 },
    io: { checkpoint: () => new Promise(() => undefined) },
  });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await progressing(h);
  assert.deepEqual(h.calls, ["start", "checkpoint:vm-1"], "the checkpoint runs on, once");
  await h.advance(29);
  assert.equal(h.state(), "SUSPENDING");
  await h.advance(1);
  assert.deepEqual([h.state(), h.actor.getSnapshot().context.stateReason], ["FAILED", "CheckpointTimedOut"]);
});

test("lifecycle - a failed restore ends in FAILED with the reason, never RUNNING", async (t) => {
  const h = harness(t, {
    checkpoints: true,
    io: { restore: () => Promise.reject(new Error("the snapshot of vm-1 is missing")) },
  });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  await h.expect("FAILED");
  assert.equal(h.actor.getSnapshot().context.stateReason, "RestoreFailed: the snapshot of vm-1 is missing");
});

test("lifecycle - a restore past its deadline, counted from its last progress, ends in FAILED, SUSPENDED until then", async (t) => {
  const h = harness(t, {
    checkpoints: true,
    timeouts: { restoreMs: 30 },
    io: { restore: () => new Promise(() => undefined) },
  });
  await h.expect("RUNNING");
  h.actor.send({ type: "SUSPEND" });
  await h.expect("SUSPENDED");
  h.actor.send({ type: "RESUME" });
  await progressing(h);
  assert.equal(h.calls.filter((call) => call.startsWith("restore:")).length, 1, "the restore runs on, once");
  await h.advance(29);
  assert.equal(h.state(), "SUSPENDED");
  await h.advance(1);
  assert.deepEqual([h.state(), h.actor.getSnapshot().context.stateReason], ["FAILED", "RestoreTimedOut"]);
});

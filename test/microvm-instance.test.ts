// End-to-end tests of a managed instance: lifecycle machine + process provider + proxy +
// client. Idle suspends (process stopped), a request auto-resumes, suspension ends in
// termination, and operations refused by the machine are reported (409).
import { after, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import {
  builtinImages,
  createAuthToken,
  createProcessProvider,
  launchMicrovmInstance,
  type MicrovmInstance,
} from "../vm-runtime/service/index.ts";
import { childProcessesWith, readProcStat } from "../vm-runtime/host/proc.ts";
import { connectMicrovm, isRpcError, type SandboxShape } from "../vm-runtime/index.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";
import type { IdlePolicy } from "../schemas/index.ts";

const key = randomBytes(32);
const provider = createProcessProvider();

after(async () => {
  await provider.close();
  assert.deepEqual(childProcessesWith(process.pid, INSTANCE_MARKER), [], "an instance process was left running");
});

async function launch(
  t: TestContext,
  microvmId: string,
  idlePolicy: Partial<IdlePolicy> = {},
  image: string = builtinImages.sandbox,
) {
  const instance = await launchMicrovmInstance({
    microvmId,
    image,
    imageIdentifier: "sandbox",
    provider,
    tokenKey: key,
    idlePolicy: { maxIdleDurationSeconds: 60, suspendedDurationSeconds: 60, autoResumeEnabled: true, ...idlePolicy },
  });
  t.after(() => instance.close());
  return instance;
}

function stubFor(instance: MicrovmInstance) {
  const authToken = createAuthToken(
    { microvmId: instance.microvmId, expirationInMinutes: 5, allowedPorts: [{ port: 8080 }] },
    key,
  ).token;
  return connectMicrovm<SandboxShape>({ endpoint: instance.endpoint, authToken });
}

function pidOf(instance: MicrovmInstance): number {
  const pid = instance.actor.getSnapshot().context.handle?.pid;
  assert.ok(pid, "instance has a pid");
  return pid;
}

test("instance - idles into SUSPENDED, auto-resumes on a request, terminates after its suspended duration", async (t) => {
  const instance = await launch(t, "vm-e2e", { maxIdleDurationSeconds: 0.3, suspendedDurationSeconds: 0.6 });
  assert.equal(instance.state(), "PENDING");
  await instance.waitForState(["RUNNING"], 10_000);
  const stub = stubFor(instance);
  assert.equal(await stub.hello("first"), "hello, first!");
  const pid = pidOf(instance);

  await instance.waitForState(["SUSPENDED"], 3_000);
  assert.equal(readProcStat(pid)?.state, "T", "a suspended instance is a stopped process");
  assert.equal(instance.actor.getSnapshot().context.stateReason, "IdleTimeout");

  const began = performance.now();
  assert.equal(await stub.hello("again"), "hello, again!");
  t.diagnostic(`auto-resume + call: ${(performance.now() - began).toFixed(1)} ms`);
  assert.equal(instance.state(), "RUNNING");
  assert.notEqual(readProcStat(pid)?.state, "T");

  await instance.waitForState(["SUSPENDED"], 3_000);
  await instance.waitForState(["TERMINATED"], 3_000);
  assert.equal(instance.actor.getSnapshot().context.stateReason, "SuspendedDurationElapsed");
  assert.equal(readProcStat(pid), undefined, "the process is gone");
});

test("instance - a request in flight keeps it from idling", async (t) => {
  const instance = await launch(t, "vm-busy", { maxIdleDurationSeconds: 0.15 });
  await instance.waitForState(["RUNNING"], 10_000);
  assert.equal(await stubFor(instance).sleep(500), 500);
  assert.equal(instance.state(), "RUNNING", "it did not suspend during a 500 ms call with a 150 ms idle limit");
  await instance.waitForState(["SUSPENDED"], 3_000);
});

test("instance - back-to-back requests past the idle limit keep it running; the clock starts after the last", async (t) => {
  const instance = await launch(t, "vm-steady", { maxIdleDurationSeconds: 0.2 });
  await instance.waitForState(["RUNNING"], 10_000);
  const stub = stubFor(instance);
  const until = performance.now() + 600;
  // The instance's clock starts when the last request ends there: after it was sent, before its
  // answer reaches this process (later still on a loaded machine), so it is timed from its send.
  let lastSent = 0;
  while (performance.now() < until) {
    lastSent = performance.now();
    assert.equal(await stub.hello("x"), "hello, x!");
  }
  assert.equal(instance.state(), "RUNNING", "it did not suspend during 600 ms of calls with a 200 ms idle limit");
  await instance.waitForState(["SUSPENDED"], 3_000);
  const idleMs = performance.now() - lastSent;
  assert.ok(idleMs >= 200, `suspended ${idleMs.toFixed(0)} ms after the last request was sent, before the idle limit`);
});

test("instance - without auto-resume a suspended instance answers 409 until ResumeMicrovm", async (t) => {
  const instance = await launch(t, "vm-manual", { autoResumeEnabled: false });
  await instance.waitForState(["RUNNING"], 10_000);
  const stub = stubFor(instance);
  assert.equal(instance.send({ type: "RESUME" }), false, "RESUME of a running instance is refused");
  assert.equal(instance.send({ type: "SUSPEND" }), true);
  await instance.waitForState(["SUSPENDED"]);
  assert.equal(instance.send({ type: "SUSPEND" }), false, "SUSPEND of a suspended instance is refused");
  await assert.rejects(
    stub.hello("x"),
    (error: unknown) => isRpcError(error, "MicrovmSuspended") && error.status === 409,
  );
  const began = performance.now();
  assert.equal(instance.send({ type: "RESUME" }), true);
  await instance.waitForState(["RUNNING"]);
  t.diagnostic(`ResumeMicrovm to RUNNING: ${(performance.now() - began).toFixed(1)} ms`);
  assert.equal(await stub.hello("back"), "hello, back!");
});

test("instance - an image that cannot start is FAILED with a stateReason", async (t) => {
  const instance = await launch(t, "vm-broken", {}, "/nonexistent/image.ts");
  assert.equal(await instance.waitForState(["FAILED", "RUNNING"], 10_000), "FAILED");
  assert.match(instance.actor.getSnapshot().context.stateReason ?? "", /^StartFailed: cannot build image/);
  assert.equal(instance.send({ type: "TERMINATE" }), true);
  await instance.waitForState(["TERMINATED"]);
});

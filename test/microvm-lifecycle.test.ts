// The idle policy and record keeping as other processes see them: state changes observed
// through GetMicrovm on a second NATS connection and straight from KV, auto-resume through
// the proxy, retention of terminal records, and a host shutdown that ends every instance.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm, KvWatchInclude, type KV } from "@nats-io/kv";
import { natsClient } from "../client/index.ts";
import { MicrovmStore, type MicrovmRecord } from "../vm-runtime/service/index.ts";
import { connectNats, bucketNames } from "../platform/index.ts";
import { microvmApi, SNAPSHOT_STEP_SECONDS, SUSPEND_WAIT_MS } from "../schemas/index.ts";
import { connectMicrovm, isRpcError, type SandboxShape } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  policy,
  isGone,
  isSuspendedOrSaved,
  startMicrovmService,
  waitForState,
  type MicrovmClient,
  type MicrovmService,
} from "./helpers/microvm.ts";

const defer = lifo(after);
let svc: MicrovmService;
/** A second connection: it shares nothing with the host but NATS. */
let observer: MicrovmClient;
let observerStore: MicrovmStore;
let observerKv: KV;

before(async () => {
  // A quota well above what the two-host test may launch before one host holds two instances.
  svc = await startMicrovmService(defer, { retentionSeconds: 2, sweepIntervalMs: 250, quotaPerPrincipal: 50 });
  const second = await connectNats({ ...svc.nats.login("admin"), name: "observer" });
  defer(() => second.close());
  observer = natsClient(microvmApi, second.nc);
  observerKv = await new Kvm(second.nc).open(bucketNames.microvms);
  observerStore = new MicrovmStore(observerKv, second.nc);
});
after(assertNoInstanceLeft);

async function stubFor(microvmId: string, endpoint: string) {
  const { authToken } = await svc.overNats.createAuthToken({
    microvmIdentifier: microvmId,
    expirationInMinutes: 5,
    allowedPorts: [{ port: 8080 }],
  });
  return connectMicrovm<SandboxShape>({ endpoint, authToken });
}

async function stored(microvmId: string): Promise<MicrovmRecord> {
  const entry = await observerStore.read(microvmId);
  assert.ok(entry, `record of ${microvmId}`);
  return entry.record;
}

describe("microvm lifecycle", () => {
  it("microvm lifecycle - idle → SUSPENDED → TERMINATED, seen from a second connection and in KV", async () => {
    const run = await svc.overNats.runMicrovm({
      idlePolicy: policy({ maxIdleDurationSeconds: 1, suspendedDurationSeconds: 1 }),
    });
    await waitForState(observer, run.microvmId, ["RUNNING"]);
    const pid = (await stored(run.microvmId)).handle?.pid;
    assert.ok(pid);

    // Idle for 1 s, then a freeze or a checkpoint (gVisor), which ends by its deadline at the latest.
    const suspended = await waitForState(observer, run.microvmId, ["SUSPENDED"], 1_000 + SUSPEND_WAIT_MS);
    assert.equal(suspended.stateReason, "IdleTimeout");
    const record = await stored(run.microvmId);
    assert.ok(isSuspendedOrSaved(pid, record));
    assert.equal(record.state, "SUSPENDED");
    assert.equal(record.hostId, svc.host.hostId);
    assert.ok(record.snapshot, "the lifecycle snapshot is stored");
    assert.doesNotMatch(JSON.stringify(record), /upstreamHeaders|x-microvm/i, "no instance secret in KV");

    const ended = await waitForState(observer, run.microvmId, ["TERMINATED"], 5_000);
    assert.equal(ended.stateReason, "SuspendedDurationElapsed");
    assert.ok(isGone(pid));
    assert.ok((await stored(run.microvmId)).terminalAt);
  });

  it("microvm lifecycle - a request through the proxy resumes an idle-suspended instance", async () => {
    const run = await svc.overNats.runMicrovm({ idlePolicy: policy({ maxIdleDurationSeconds: 1 }) });
    await waitForState(observer, run.microvmId, ["RUNNING"]);
    const stub = await stubFor(run.microvmId, run.endpoint);
    await waitForState(observer, run.microvmId, ["SUSPENDED"], 1_000 + SUSPEND_WAIT_MS);
    const began = performance.now();
    assert.equal(await stub.hello("wake up"), "hello, wake up!");
    const elapsed = performance.now() - began;
    // The call was answered by the resumed instance: RUNNING, its record written at once.
    await waitForState(observer, run.microvmId, ["RUNNING"], 2_000);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: run.microvmId });
    // A thaw takes milliseconds, a restore (gVisor) seconds on a busy host: the bound is the
    // restore's deadline, past which the instance would be FAILED and the call refused.
    console.log(`# auto-resume + call: ${elapsed.toFixed(0)} ms`);
    assert.ok(elapsed < SNAPSHOT_STEP_SECONDS * 1000, `auto-resume + call took ${elapsed.toFixed(0)} ms`);
  });

  it("microvm lifecycle - without auto-resume a suspended instance answers 409 until ResumeMicrovm", async () => {
    const run = await svc.overNats.runMicrovm({ idlePolicy: policy({ autoResumeEnabled: false }) });
    await waitForState(observer, run.microvmId, ["RUNNING"]);
    const stub = await stubFor(run.microvmId, run.endpoint);
    await svc.overNats.suspendMicrovm({ microvmIdentifier: run.microvmId });
    await assert.rejects(stub.hello("x"), (err: unknown) => isRpcError(err, "MicrovmSuspended") && err.status === 409);
    await svc.overNats.resumeMicrovm({ microvmIdentifier: run.microvmId });
    assert.equal(await stub.hello("back"), "hello, back!");
    await svc.overNats.terminateMicrovm({ microvmIdentifier: run.microvmId });
  });

  it("microvm lifecycle - terminal records are deleted after the retention period", async () => {
    const run = await svc.overNats.runMicrovm({ idlePolicy: policy() });
    await svc.overNats.terminateMicrovm({ microvmIdentifier: run.microvmId });
    assert.equal((await observer.getMicrovm({ microvmIdentifier: run.microvmId })).state, "TERMINATED");
    const deadline = Date.now() + 6_000;
    while ((await observerStore.read(run.microvmId)) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    await assert.rejects(observer.getMicrovm({ microvmIdentifier: run.microvmId }), { _tag: "MicrovmNotFound" });
    const jsm = await jetstreamManager(svc.handle.nc);
    const info = await jsm.streams.info(`KV_${bucketNames.microvms}`, {
      subjects_filter: `$KV.${bucketNames.microvms}.${run.microvmId}`,
    });
    assert.equal(info.state.subjects, undefined, "no delete marker is left behind");
  });

  it("microvm lifecycle - closing a host terminates its instances and records it", async () => {
    const { host } = await svc.addHost({ hostId: "closing-host", quotaPerPrincipal: 50 });
    const api = svc.overNats;
    const ids: string[] = [];
    // Queue groups spread runs over both hosts: keep launching until the closing host has two.
    while (host.liveInstances().length < 2) {
      assert.ok(ids.length < 40, `40 launches and the closing host holds ${host.liveInstances().length}`);
      ids.push((await api.runMicrovm({ idlePolicy: policy() })).microvmId);
    }
    const mine = host.liveInstances();
    const pids = await Promise.all(
      mine.map(async (id) => (await waitForState(observer, id, ["RUNNING"])) && (await stored(id)).handle!.pid!),
    );
    // Every write of the records, seen as it happens: a record ended first may be past this
    // service's 2 s retention, and deleted by the other host's sweep, before the close returns.
    const lastWrite = new Map<string, [string, string | undefined]>();
    const watch = await observerKv.watch({ include: KvWatchInclude.UpdatesOnly });
    const watching = (async () => {
      for await (const entry of watch) {
        if (entry.operation !== "PUT") continue;
        const record = entry.json<MicrovmRecord>();
        if (mine.includes(record.microvmId)) lastWrite.set(record.microvmId, [record.state, record.stateReason]);
      }
    })();
    await host.close();
    // The close returns once each instance's record was written: its write reaches the watch next.
    for (const deadline = Date.now() + 10_000; mine.some((id) => lastWrite.get(id)?.[0] !== "TERMINATED"); ) {
      assert.ok(Date.now() < deadline, `records after the close: ${JSON.stringify([...lastWrite])}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    watch.stop();
    await watching;
    for (const id of mine) assert.deepEqual(lastWrite.get(id), ["TERMINATED", "HostShutdown"], id);
    for (const pid of pids) assert.ok(isGone(pid));
    await Promise.all(
      ids.filter((id) => !mine.includes(id)).map((id) => api.terminateMicrovm({ microvmIdentifier: id })),
    );
  });
});

// Suspend that survives, through the service on the gVisor provider (real runsc, NATS, Object
// Store) with the counter image (state in memory and in a scratch file): SuspendMicrovm stores
// a snapshot and leaves no process; ResumeMicrovm and auto-resume restore it; the idle policy
// checkpoints and its suspendedDurationSeconds deletes the snapshot, as terminate does; a
// damaged snapshot ends in FAILED with the reason; another principal cannot resume it. A resume
// on the host that suspended restores from its own image of it.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { hostSubject, hostWorkDir, MicrovmStore, type MicrovmRecord } from "../vm-runtime/service/index.ts";
import { bucketNames, snapshotObjectBucket } from "../platform/index.ts";
import { httpClient, natsClient } from "../client/index.ts";
import { microvmApi, nameToken, SUSPEND_WAIT_MS } from "../schemas/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { LOCAL_SNAPSHOTS_DIR } from "../vm-runtime/snapshots/keeper.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  describeProcess,
  hostCgroupPids,
  isGone,
  policy,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";
import { gvisorSkip } from "./helpers/providers.ts";

interface Counter {
  readonly memory: number;
  readonly file: number;
  readonly bornAt: string;
}
type CounterShape = { increment(): Promise<number>; read(): Promise<Counter> };

/** The principal of callers on the public NATS subjects. */
const NATS_OWNER = "nats:internal";
const defer = lifo(after);
const skipGvisor = await gvisorSkip();

describe("microvm snapshots", { skip: skipGvisor }, () => {
  let svc: MicrovmService;
  let objects: ObjectStore;
  let records: MicrovmStore;

  before(async () => {
    svc = await startMicrovmService(defer, {
      // Snapshots are the default on gVisor.
      provider: "gvisor",
      // Terminate's own wait to settle: suspend and resume must not be cut short by it.
      settleMs: 50,
      images: { counter: testImages.counter },
      limits: { memoryMiB: 96, scratchMiB: 8, warmInstances: 0 },
      retentionSeconds: 60,
    });
    objects = await new Objm(svc.handle.nc).create(snapshotObjectBucket);
    records = new MicrovmStore(await new Kvm(svc.handle.nc).open(bucketNames.microvms), svc.handle.nc);
  });
  after(assertNoInstanceLeft);

  const objectName = (microvmId: string) => `${nameToken(NATS_OWNER)}/${nameToken(microvmId)}`;
  const stored = async (microvmId: string) => {
    const info = await objects.info(objectName(microvmId));
    return info && !info.deleted ? info : undefined;
  };
  async function record(microvmId: string): Promise<MicrovmRecord> {
    const entry = await records.read(microvmId);
    assert.ok(entry, `record of ${microvmId}`);
    return entry.record;
  }
  /** Waits until the instance's snapshot object is gone (it is deleted once the instance ends). */
  async function snapshotGone(microvmId: string): Promise<void> {
    const deadline = Date.now() + 10_000;
    while ((await stored(microvmId)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.equal(await stored(microvmId), undefined, `the snapshot of ${microvmId} is still stored`);
  }
  /** Where the host keeps the images of its SUSPENDED instances. */
  const localImages = () => join(svc.host.workDir, LOCAL_SNAPSHOTS_DIR);
  const pidsOf = (microvmId: string) => hostCgroupPids(hostWorkDir(svc.dataDir, svc.host.hostId), { microvmId }) ?? [];

  async function runCounter(overrides: Parameters<typeof policy>[0] = {}) {
    const run = await svc.overNats.runMicrovm({ imageIdentifier: "counter", idlePolicy: policy(overrides) });
    await waitForState(svc.overNats, run.microvmId, ["RUNNING"], 30_000);
    const { authToken } = await svc.overNats.createAuthToken({
      microvmIdentifier: run.microvmId,
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    const stub = connectMicrovm<CounterShape>({ endpoint: run.endpoint, authToken });
    return { ...run, stub };
  }

  /** Suspends; asserts the snapshot is stored and every process the instance had is gone. */
  async function suspend(microvmId: string): Promise<MicrovmRecord> {
    const pids = pidsOf(microvmId);
    assert.ok(pids.length > 0, "the running instance has processes");
    await svc.overNats.suspendMicrovm({ microvmIdentifier: microvmId });
    await waitForState(svc.overNats, microvmId, ["SUSPENDED"]);
    const saved = await record(microvmId);
    assert.match(saved.checkpoint?.digest ?? "", /^sha256:[0-9a-f]{64}$/, "the record names its snapshot");
    assert.equal((await stored(microvmId))?.size, saved.checkpoint?.bytes, "the snapshot object is stored");
    assert.equal(saved.handle, undefined, "a checkpointed instance has no handle");
    const left = pids.filter((pid) => !isGone(pid));
    assert.deepEqual(left, [], `a process of the SUSPENDED instance is left: ${left.map(describeProcess).join("; ")}`);
    assert.deepEqual(pidsOf(microvmId), [], "a cgroup of the SUSPENDED instance holds a process");
    return saved;
  }

  it("microvm snapshots - suspend stores a snapshot and ends the instance; resume restores memory and file", async () => {
    const vm = await runCounter();
    for (let i = 0; i < 3; i++) await vm.stub.increment();
    const before = await vm.stub.read();
    const suspendAt = Date.now();
    const saved = await suspend(vm.microvmId);
    console.log(
      `# counter snapshot: ${saved.checkpoint?.bytes} bytes stored, suspend to SUSPENDED ${Date.now() - suspendAt} ms`,
    );
    const began = Date.now();
    await svc.overNats.resumeMicrovm({ microvmIdentifier: vm.microvmId });
    const resumed = await waitForState(svc.overNats, vm.microvmId, ["RUNNING"]);
    console.log(`# resume to RUNNING: ${Date.now() - began} ms`);
    assert.equal(resumed.endpoint, vm.endpoint, "the endpoint stays");
    assert.deepEqual(await vm.stub.read(), before);
    assert.equal(await stored(vm.microvmId), undefined, "a restored instance's snapshot is deleted");
    await suspend(vm.microvmId);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(svc.overNats, vm.microvmId, ["TERMINATED"]);
    await snapshotGone(vm.microvmId);
  });

  it("microvm snapshots - suspend and resume answer once settled, over NATS and HTTP, whatever the callers' own time", async () => {
    const vm = await runCounter({ autoResumeEnabled: false });
    await vm.stub.increment();
    // Callers whose own time for an answer (1 ms) is shorter than any checkpoint or restore:
    // only the operations' wait, added to it, lets the answer arrive.
    const impatient = {
      nats: natsClient(microvmApi, svc.handle.nc, { timeoutMs: 1 }),
      http: httpClient(microvmApi, await svc.addGateway({ requestTimeoutMs: 1 })),
    };
    // The gateway's principal is `anonymous`: its own instance, run through a patient gateway.
    const overHttp = await svc.overHttp.runMicrovm({ imageIdentifier: "counter", idlePolicy: policy() });
    await waitForState(svc.overHttp, overHttp.microvmId, ["RUNNING"], 30_000);
    for (const [client, microvmId] of [
      [impatient.nats, vm.microvmId],
      [impatient.http, overHttp.microvmId],
    ] as const) {
      const microvmIdentifier = microvmId;
      assert.deepEqual(await client.suspendMicrovm({ microvmIdentifier }), { microvmId, state: "SUSPENDED" });
      assert.ok((await record(microvmId)).checkpoint, "answered SUSPENDED once its snapshot is stored");
      assert.deepEqual(await client.resumeMicrovm({ microvmIdentifier }), { microvmId, state: "RUNNING" });
    }
    // Auto-resume is off: the first call after the answer works only if it is RUNNING indeed.
    assert.equal((await vm.stub.read()).memory, 1);
    for (const [client, microvmId] of [
      [svc.overNats, vm.microvmId],
      [svc.overHttp, overHttp.microvmId],
    ] as const) {
      await client.terminateMicrovm({ microvmIdentifier: microvmId });
      await waitForState(client, microvmId, ["TERMINATED"]);
    }
  });

  it("microvm snapshots - ten suspends, each resumed by an RPC with auto-resume, keep counting", async () => {
    const vm = await runCounter({ autoResumeEnabled: true });
    const { bornAt } = await vm.stub.read();
    for (let cycle = 1; cycle <= 10; cycle++) {
      assert.equal(await vm.stub.increment(), cycle);
      await suspend(vm.microvmId);
      assert.deepEqual(await vm.stub.read(), { memory: cycle, file: cycle, bornAt }, `cycle ${cycle}`);
    }
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(svc.overNats, vm.microvmId, ["TERMINATED"]);
  });

  it("microvm snapshots - the idle policy checkpoints, and suspendedDurationSeconds deletes the snapshot", async () => {
    const vm = await runCounter({ maxIdleDurationSeconds: 1, suspendedDurationSeconds: 2 });
    await vm.stub.increment();
    // Idle for 1 s, then the checkpoint, which leaves SUSPENDING by its deadline at the latest.
    const suspended = await waitForState(svc.overNats, vm.microvmId, ["SUSPENDED"], 1_000 + SUSPEND_WAIT_MS);
    assert.equal(suspended.stateReason, "IdleTimeout");
    assert.ok((await record(vm.microvmId)).checkpoint, "the idle suspend stored a snapshot");
    assert.ok(await stored(vm.microvmId));
    const ended = await waitForState(svc.overNats, vm.microvmId, ["TERMINATED"], 10_000);
    assert.equal(ended.stateReason, "SuspendedDurationElapsed");
    await snapshotGone(vm.microvmId);
  });

  it("microvm snapshots - resumed on the host that suspended it, an instance restores from that host's image, not the store's copy", async () => {
    const vm = await runCounter({ autoResumeEnabled: false });
    await vm.stub.increment();
    const images = async () => readdir(localImages()).catch(() => [] as string[]);
    const before = await images();
    await suspend(vm.microvmId);
    const kept = (await images()).filter((name) => !before.includes(name));
    assert.equal(kept.length, 1, "the host keeps its image while SUSPENDED");
    // The store's copy is never read here: damaged, it is not noticed, and goes with the resume.
    await objects.putBlob({ name: objectName(vm.microvmId) }, randomBytes(4096));
    assert.equal((await svc.overNats.resumeMicrovm({ microvmIdentifier: vm.microvmId })).state, "RUNNING");
    assert.equal((await vm.stub.read()).memory, 1, "its memory came back");
    assert.ok(!(await images()).includes(kept[0]!), "the image goes once it runs again");
    await snapshotGone(vm.microvmId);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(svc.overNats, vm.microvmId, ["TERMINATED"]);
  });

  it("microvm snapshots - a damaged snapshot ends in FAILED with the reason; other instances go on", async () => {
    const vm = await runCounter({ autoResumeEnabled: false });
    const other = await runCounter();
    await other.stub.increment();
    await vm.stub.increment();
    await suspend(vm.microvmId);
    // Bytes that are not the snapshot the record names (the store checks its digest), and no
    // image of its own on the host: the store's copy is what the resume loads.
    await objects.putBlob({ name: objectName(vm.microvmId) }, randomBytes(4096));
    await rm(localImages(), { recursive: true, force: true });
    await svc.overNats.resumeMicrovm({ microvmIdentifier: vm.microvmId });
    const failed = await waitForState(svc.overNats, vm.microvmId, ["FAILED"], 10_000);
    assert.match(
      failed.stateReason ?? "",
      /^RestoreFailed: the snapshot of .* does not match the digest on its record$/,
    );
    assert.equal((await other.stub.read()).memory, 1, "another instance still answers with its state");
    await snapshotGone(vm.microvmId);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: other.microvmId });
    await waitForState(svc.overNats, other.microvmId, ["TERMINATED"]);
  });

  it("microvm snapshots - another principal cannot resume or see a suspended instance", async () => {
    const vm = await runCounter({ autoResumeEnabled: false });
    await suspend(vm.microvmId);
    // Over HTTP without API keys the caller is `anonymous`, not the NATS user that launched it.
    await assert.rejects(svc.overHttp.resumeMicrovm({ microvmIdentifier: vm.microvmId }), /MicrovmNotFound/);
    assert.equal((await record(vm.microvmId)).state, "SUSPENDED");
    assert.ok(await stored(vm.microvmId), "the snapshot is untouched");
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(svc.overNats, vm.microvmId, ["TERMINATED"]);
    await snapshotGone(vm.microvmId);
  });

  it("microvm snapshots - a host whose instance another host adopted neither rewrites its record nor deletes its snapshot", async () => {
    const vm = await runCounter({ autoResumeEnabled: false });
    await vm.stub.increment();
    const saved = await suspend(vm.microvmId);
    // Another host took it over while this one was thought gone (it answers its pings: not gone).
    const elsewhere = svc.handle.nc.subscribe(hostSubject("", "elsewhere", "ping"), {
      callback: (_err, msg) => {
        msg.respond();
      },
    });
    try {
      await records.update(vm.microvmId, (current) => ({ ...current, hostId: "elsewhere" }));
      await svc.host.sweep();
      const deadline = Date.now() + 10_000;
      while (svc.host.liveInstances().includes(vm.microvmId) && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(svc.host.liveInstances().includes(vm.microvmId), false, "this host let go of it");
      const now = await record(vm.microvmId);
      assert.deepEqual([now.hostId, now.state], ["elsewhere", "SUSPENDED"], "its record is the adopter's");
      assert.equal((await stored(vm.microvmId))?.digest !== undefined, true, "its snapshot is still stored");
      assert.equal(now.checkpoint?.digest, saved.checkpoint?.digest);
    } finally {
      elsewhere.unsubscribe();
      await records.update(vm.microvmId, (current) => ({
        ...current,
        state: "TERMINATED",
        terminalAt: new Date().toISOString(),
      }));
      await objects.delete(objectName(vm.microvmId));
    }
  });
});

// A suspend whose snapshot would pass its owner's snapshot quota is refused up front and the
// instance runs on (gVisor, real runsc, NATS, Object Store; the counter image, quota 1 MiB, its
// cgroup holding far more): a 429 SnapshotQuotaExceeded naming the quota, the instance RUNNING
// with the same processes and its memory, never checkpointed, nothing stored.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { ClientError } from "../client/index.ts";
import { hostWorkDir } from "../vm-runtime/service/index.ts";
import { snapshotObjectBucket } from "../platform/index.ts";
import { nameToken } from "../schemas/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  hostCgroupPids,
  policy,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";
import { gvisorSkip } from "./helpers/providers.ts";

type CounterShape = {
  increment(): Promise<number>;
  read(): Promise<{ memory: number; file: number; bornAt: string }>;
};

const NATS_OWNER = "nats:internal";
const defer = lifo(after);
const skipGvisor = await gvisorSkip();

describe("microvm snapshot quota", { skip: skipGvisor }, () => {
  let svc: MicrovmService;
  let objects: ObjectStore;

  before(async () => {
    svc = await startMicrovmService(defer, {
      provider: "gvisor",
      snapshotQuotaMiB: 1,
      images: { counter: testImages.counter },
      limits: { memoryMiB: 96, scratchMiB: 8, warmInstances: 0 },
    });
    objects = await new Objm(svc.handle.nc).create(snapshotObjectBucket);
  });
  after(assertNoInstanceLeft);

  const pidsOf = (microvmId: string) =>
    (hostCgroupPids(hostWorkDir(svc.dataDir, svc.host.hostId), { microvmId }) ?? []).sort();

  /** Suspends, expecting the refusal: 429 SnapshotQuotaExceeded, RUNNING, the quota named. */
  async function refusedSuspend(microvmId: string): Promise<void> {
    await assert.rejects(svc.overNats.suspendMicrovm({ microvmIdentifier: microvmId }), (err: unknown) => {
      assert.ok(err instanceof ClientError, String(err));
      assert.equal(err.status, 429);
      assert.deepEqual(
        { ...err.error, message: undefined },
        { _tag: "SnapshotQuotaExceeded", microvmId, quota: 1048576, message: undefined },
      );
      assert.match(
        (err.error as { message: string }).message,
        /^the instance was not suspended and runs on: your snapshots take 0\.0 MiB \(0 bytes\) of your snapshot quota of 1\.0 MiB \(1048576 bytes\), and this one would take [\d.]+ MiB \(\d+ bytes\) more: terminate or resume a suspended instance first$/,
      );
      return true;
    });
    const vm = await svc.overNats.getMicrovm({ microvmIdentifier: microvmId });
    assert.equal(vm.state, "RUNNING");
    const info = await objects.info(`${nameToken(NATS_OWNER)}/${nameToken(microvmId)}`);
    assert.ok(!info || info.deleted, "nothing is stored");
  }

  /** A RUNNING counter instance and its stub. */
  async function runCounter(autoResumeEnabled: boolean) {
    const { microvmId, endpoint } = await svc.overNats.runMicrovm({
      imageIdentifier: "counter",
      idlePolicy: policy({ autoResumeEnabled }),
    });
    await waitForState(svc.overNats, microvmId, ["RUNNING"], 30_000);
    const { authToken } = await svc.overNats.createAuthToken({
      microvmIdentifier: microvmId,
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    return { microvmId, stub: connectMicrovm<CounterShape>({ endpoint, authToken }) };
  }

  it("microvm snapshot quota - a suspend past the quota is a 429 before any checkpoint, and the instance runs on with its state", async () => {
    const { microvmId, stub } = await runCounter(false);
    await stub.increment();
    await stub.increment();
    const counted = await stub.read();
    const first = pidsOf(microvmId);
    assert.ok(first.length > 0, "the instance's processes are found");

    for (let i = 0; i < 2; i++) {
      await refusedSuspend(microvmId);
      assert.deepEqual(pidsOf(microvmId), first, "the same processes run on: never checkpointed");
      assert.deepEqual(await stub.read(), counted, "memory and file as before the suspend");
    }
    assert.equal(await stub.increment(), 3);

    await svc.overNats.terminateMicrovm({ microvmIdentifier: microvmId });
    await waitForState(svc.overNats, microvmId, ["TERMINATED"]);
  });
});

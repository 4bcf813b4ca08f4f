// A suspend whose snapshot would pass its owner's snapshot quota is refused and the instance
// runs on (gVisor, real runsc, NATS, Object Store; the counter image, quota 1 MiB, its snapshot
// about 4 MB): a 409 InvalidStateTransition naming the quota, the instance RUNNING with its
// memory, nothing stored; once its size is known, the next one is refused before any checkpoint.
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

  /** Suspends, expecting the refusal: 409 InvalidStateTransition, RUNNING, the quota named. */
  async function refusedSuspend(microvmId: string): Promise<void> {
    await assert.rejects(svc.overNats.suspendMicrovm({ microvmIdentifier: microvmId }), (err: unknown) => {
      assert.ok(err instanceof ClientError, String(err));
      assert.equal(err.status, 409);
      assert.deepEqual(
        { ...err.error, message: undefined },
        {
          _tag: "InvalidStateTransition",
          microvmId,
          state: "RUNNING",
          message: undefined,
        },
      );
      assert.match(
        (err.error as { message: string }).message,
        /^the instance was not suspended: your snapshots take 0\.0 MiB \(0 bytes\) of your snapshot quota of 1\.0 MiB \(1048576 bytes\), and this one would take [\d.]+ MiB \(\d+ bytes\) more: terminate or resume a suspended instance first$/,
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

  it("microvm snapshot quota - a suspend past the quota is a 409, and the instance runs on with its state", async () => {
    const { microvmId, stub } = await runCounter(false);
    await stub.increment();
    await stub.increment();
    const counted = await stub.read();
    const first = pidsOf(microvmId);

    // Its size is known only once checkpointed: too large, it is restored from what it saved.
    await refusedSuspend(microvmId);
    assert.deepEqual(await stub.read(), counted, "memory and file as before the suspend");
    const restored = pidsOf(microvmId);
    assert.notDeepEqual(restored, first, "the first refusal came after a checkpoint and a restore");

    // Its size known, the next suspend is refused up front: the same processes run on.
    await refusedSuspend(microvmId);
    assert.deepEqual(pidsOf(microvmId), restored, "the instance was not checkpointed again");
    assert.equal(await stub.increment(), 3);

    await svc.overNats.terminateMicrovm({ microvmIdentifier: microvmId });
    await waitForState(svc.overNats, microvmId, ["TERMINATED"]);
  });

  it("microvm snapshot quota - a request through the proxy during a refused suspend is answered by the instance running on", async () => {
    const { microvmId, stub } = await runCounter(true);
    assert.equal(await stub.increment(), 1);
    // Its first refusal comes after a checkpoint and a restore: seconds in SUSPENDING.
    const suspending = refusedSuspend(microvmId);
    await waitForState(svc.overNats, microvmId, ["SUSPENDING"]);
    assert.equal(await stub.increment(), 2, "answered by the instance once it runs on");
    await suspending;
    await svc.overNats.terminateMicrovm({ microvmIdentifier: microvmId });
    await waitForState(svc.overNats, microvmId, ["TERMINATED"]);
  });
});

// 100 launches through the launch helper whose caller work throws (10 at a time), over NATS:
// afterwards no instance process runs and no record is left in a live state.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { launchMicrovm } from "../../client/index.ts";
import type { SandboxShape } from "../../vm-runtime/index.ts";
import { lifo } from "../helpers/defer.ts";
import {
  assertNoInstanceLeft,
  instanceChildren,
  startMicrovmService,
  type MicrovmService,
} from "../helpers/microvm.ts";

const LAUNCHES = Number(process.env.MICROVM_LAUNCHES ?? 100);
const AT_ONCE = 10;

class WorkFailed extends Error {
  override readonly name = "WorkFailed";
}

describe("faults: microVM launches", () => {
  const defer = lifo(after);
  let svc: MicrovmService;
  before(async () => {
    // The host limit and the quota are not under test here. Both count an instance until it
    // is gone, and a terminate may answer TERMINATING (its settle wait ends first on a loaded
    // machine): with limits of 10-20, a worker's next launch could then be refused with 429.
    svc = await startMicrovmService(defer, { maxInstances: LAUNCHES, quotaPerPrincipal: LAUNCHES });
  });
  after(assertNoInstanceLeft);

  it(`microvm launches - ${LAUNCHES} launches whose work throws leave 0 processes and 0 live records`, async () => {
    const started = Date.now();
    let next = 0;
    let rejectedWithWork = 0;
    const answered: string[] = [];
    const worker = async () => {
      while (next < LAUNCHES) {
        const i = next++;
        const outcome = await launchMicrovm<SandboxShape, never>(svc.overNats, async (stub, vm) => {
          answered.push(await stub.hello(String(i)));
          assert.ok(vm.microvmId);
          throw new WorkFailed(`work ${i}`);
        }).then(
          () => "resolved",
          (err: unknown) => err,
        );
        if (outcome instanceof WorkFailed) rejectedWithWork++;
        else assert.fail(`launch ${i} ended with ${String(outcome)}`);
      }
    };
    await Promise.all(Array.from({ length: AT_ONCE }, worker));
    const { items } = await svc.overNats.listMicrovms({});
    const live = items.filter((item) => item.state !== "TERMINATED");
    console.log(
      `# microvm launches: ` +
        JSON.stringify({
          launches: LAUNCHES,
          atOnce: AT_ONCE,
          workRan: answered.length,
          seconds: (Date.now() - started) / 1000,
          processesLeft: instanceChildren({ instancesOnly: true }).length,
          liveRecords: live.length,
        }),
    );
    assert.equal(rejectedWithWork, LAUNCHES, "every launch rejected with the work's own error");
    assert.equal(answered.length, LAUNCHES, "every instance answered before the work threw");
    assert.deepEqual(instanceChildren({ instancesOnly: true }), [], "no instance process left");
    assert.deepEqual(
      live.map((item) => `${item.microvmId} ${item.state}`),
      [],
      "no live record left",
    );
    assert.deepEqual(svc.host.liveInstances(), []);
  });
});

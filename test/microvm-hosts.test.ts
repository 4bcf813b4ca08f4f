// Several hosts on one NATS: any host answers reads from KV, and operations that act on an
// instance reach its owner — a host that gets one for another host's instance forwards it to
// the owner's own subject and relays the answer, declared errors included.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subscription } from "@nats-io/transport-node";
import { ClientError } from "../client/index.ts";
import {
  hostCgroupKey,
  hostGoneReason,
  hostSubject,
  hostWorkDir,
  MicrovmStore,
  startMicrovmHost,
  type InstanceOp,
  type MicrovmRecord,
} from "../vm-runtime/service/index.ts";
import { connectMicrovm, type SandboxShape } from "../vm-runtime/index.ts";
import { readProcStat } from "../vm-runtime/host/proc.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  cgroupsLeftOfHostKey,
  policy,
  isGone,
  isSuspendedOrSaved,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";

const defer = lifo(after);
let svc: MicrovmService;
let store: MicrovmStore;
const hostB = "host-b";

before(async () => {
  svc = await startMicrovmService(defer, { hostId: "host-a" });
  await svc.addHost({ hostId: hostB });
  store = new MicrovmStore(svc.kv, svc.handle.nc);
});
after(assertNoInstanceLeft);

/**
 * Runs until the queue group put an instance on `hostId` (each run lands on either host, at
 * random). A run that landed on the other host is terminated at once, so a long streak of them
 * never meets the principal's quota.
 */
async function runOn(hostId: string): Promise<{ microvmId: string; endpoint: string }> {
  for (let attempt = 0; attempt < 40; attempt++) {
    const run = await svc.overNats.runMicrovm({ idlePolicy: policy() });
    if ((await store.read(run.microvmId))?.record.hostId === hostId) return run;
    await svc.overNats.terminateMicrovm({ microvmIdentifier: run.microvmId });
  }
  assert.fail(`no run landed on ${hostId}`);
}

/** Counts requests forwarded to `hostId`'s own subject for `op` (a plain subscriber sees each). */
function watchForwards(hostId: string, op: InstanceOp): { count(): number; sub: Subscription } {
  let seen = 0;
  const sub = svc.handle.nc.subscribe(hostSubject("", hostId, op), {
    callback: () => {
      seen += 1;
    },
  });
  return { count: () => seen, sub };
}

describe("microvm hosts", () => {
  it("microvm hosts - token, 409 and suspend reach the owner through another host", async () => {
    const vm = await runOn(hostB);
    await waitForState(svc.overNats, vm.microvmId, ["RUNNING"]);
    const forwards = watchForwards(hostB, "createAuthToken");
    // Each request lands on either host; keep asking until one was forwarded (and all work).
    let token = "";
    for (let i = 0; i < 30 && forwards.count() === 0; i++) {
      const answer = await svc.overNats.createAuthToken({
        microvmIdentifier: vm.microvmId,
        expirationInMinutes: 5,
        allowedPorts: [{ port: 8080 }],
      });
      token = answer.authToken["X-aws-proxy-auth"];
      await svc.handle.nc.flush();
    }
    forwards.sub.unsubscribe();
    assert.ok(forwards.count() > 0, "a token request was forwarded to the owner");
    // Only the owner's key verifies: a token minted by the wrong host would be a 403 here.
    assert.equal(
      await connectMicrovm<SandboxShape>({ endpoint: vm.endpoint, authToken: token }).hello("b"),
      "hello, b!",
    );

    const refused = watchForwards(hostB, "resumeMicrovm");
    for (let i = 0; i < 30 && refused.count() === 0; i++) {
      const err = await svc.overNats.resumeMicrovm({ microvmIdentifier: vm.microvmId }).catch((e: unknown) => e);
      assert.ok(err instanceof ClientError && err._tag === "InvalidStateTransition" && err.status === 409, String(err));
      assert.deepEqual([err.error.microvmId, err.error.state], [vm.microvmId, "RUNNING"]);
      await svc.handle.nc.flush();
    }
    refused.sub.unsubscribe();
    assert.ok(refused.count() > 0, "a refused resume was forwarded and its 409 relayed");

    const pid = (await store.read(vm.microvmId))!.record.handle!.pid!;
    assert.equal((await svc.overNats.suspendMicrovm({ microvmIdentifier: vm.microvmId })).state, "SUSPENDED");
    assert.ok(isSuspendedOrSaved(pid, (await store.read(vm.microvmId))?.record));
    assert.equal((await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId })).state, "TERMINATED");
    assert.ok(isGone(pid));
  });

  it("microvm hosts - terminate through either host ends the owner's instance", async () => {
    const vm = await runOn(hostB);
    const forwards = watchForwards(hostB, "terminateMicrovm");
    // Repeated terminates are idempotent; go on until one went through host-a.
    let state = "";
    for (let i = 0; i < 30 && forwards.count() === 0; i++) {
      state = (await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId })).state;
      await svc.handle.nc.flush();
    }
    forwards.sub.unsubscribe();
    assert.ok(forwards.count() > 0);
    assert.equal(state, "TERMINATED");
    assert.equal(
      (await svc.overNats.getMicrovm({ microvmIdentifier: vm.microvmId })).stateReason,
      "TerminateRequested",
    );
  });

  it("microvm hosts - a host id held by another live process refuses to start", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "microvm-lock-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const workDir = hostWorkDir(dataDir, "taken");
    await mkdir(workDir, { recursive: true });
    // Process 1 is alive and is not this process: the lock is held.
    await writeFile(
      join(workDir, "host.lock"),
      JSON.stringify({ pid: 1, startTime: readProcStat(1)!.startTime, urls: [] }),
    );
    await assert.rejects(
      startMicrovmHost(svc.handle.nc, { kv: svc.kv, dataDir, hostId: "taken" }),
      /in use by process 1/,
    );
  });

  it("microvm hosts - of two hosts with one id starting at the same moment, one refuses", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "microvm-lock-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const starts = await Promise.allSettled(
      [1, 2].map(() => startMicrovmHost(svc.handle.nc, { kv: svc.kv, dataDir, hostId: "twin" })),
    );
    const started = starts.filter((s) => s.status === "fulfilled");
    const refused = starts.filter((s) => s.status === "rejected");
    await Promise.all(started.map((s) => s.value.close()));
    assert.equal(started.length, 1, "exactly one host runs");
    assert.match(String(refused[0]?.reason), /in use by process/);
  });

  it("microvm hosts - a host of the same id on another data dir and NATS leaves this host's instances running", async () => {
    const vm = await runOn(svc.host.hostId);
    await waitForState(svc.overNats, vm.microvmId, ["RUNNING"]);
    const pid = (await store.read(vm.microvmId))!.record.handle!.pid!;
    // Its start reclaims what an earlier run of *its* host left: not this host's cgroup.
    const other = await startMicrovmService(defer, { hostId: svc.host.hostId });
    assert.equal(other.host.hostId, svc.host.hostId);
    assert.ok(!isGone(pid), "the instance's process outlived the other host's start");
    const token = await svc.overNats.createAuthToken({
      microvmIdentifier: vm.microvmId,
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    const rpc = connectMicrovm<SandboxShape>({ endpoint: vm.endpoint, authToken: token.authToken["X-aws-proxy-auth"] });
    assert.equal(await rpc.hello("twin"), "hello, twin!");
    assert.equal((await svc.overNats.getMicrovm({ microvmIdentifier: vm.microvmId })).state, "RUNNING");
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
  });

  it("microvm hosts - a host whose NATS connection is gone when it closes still ends its instances and removes its cgroups", async () => {
    const third = await svc.addHost({ hostId: "host-c" });
    const vm = await runOn("host-c");
    await waitForState(svc.overNats, vm.microvmId, ["RUNNING"]);
    const pid = (await store.read(vm.microvmId))!.record.handle!.pid!;
    await third.handle.close();
    // Its record cannot be written any more: the close may say so, but its walls go all the same.
    await third.host.close().catch(() => undefined);
    assert.ok(isGone(pid), "the instance outlived its host's close");
    assert.deepEqual(cgroupsLeftOfHostKey(hostCgroupKey(third.host.workDir)), [], "the host's cgroups are left");
    // Its record still says RUNNING: another host answers for the gone owner and ends it.
    await svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId });
  });

  it("microvm hosts - the sweep ends records of a host that stays silent for two sweeps", async () => {
    const ghost: MicrovmRecord = {
      microvmId: crypto.randomUUID(),
      imageIdentifier: "sandbox",
      state: "RUNNING",
      endpoint: "127.0.0.1:1",
      idlePolicy: policy(),
      startedAt: new Date().toISOString(),
      hostId: "ghost-host",
      owner: "nats:internal",
      updatedAt: new Date().toISOString(),
    };
    assert.ok(await store.create(ghost));
    assert.equal((await svc.host.sweep()).ownerless, 0, "one silent sweep only makes the owner a suspect");
    assert.equal((await svc.host.sweep()).ownerless, 1);
    const vm = await svc.overNats.getMicrovm({ microvmIdentifier: ghost.microvmId });
    assert.deepEqual([vm.state, vm.stateReason], ["TERMINATED", hostGoneReason("ghost-host")]);
  });

  it("microvm hosts - an instance whose record was ended or deleted elsewhere is terminated", async () => {
    const ended = await runOn(svc.host.hostId);
    const deleted = await runOn(svc.host.hostId);
    for (const vm of [ended, deleted]) await waitForState(svc.overNats, vm.microvmId, ["RUNNING"]);
    const pids = await Promise.all(
      [ended, deleted].map(async (vm) => (await store.read(vm.microvmId))!.record.handle!.pid!),
    );
    await store.update(ended.microvmId, (record) => ({
      ...record,
      state: "TERMINATED",
      stateReason: "Operator",
      terminalAt: new Date().toISOString(),
    }));
    await svc.kv.delete(deleted.microvmId);
    await svc.host.sweep();
    // The processes end first; the host forgets an instance once its actor has finished (record
    // written, image released), a moment later: wait for both.
    const forgotten = () => !svc.host.liveInstances().some((id) => id === ended.microvmId || id === deleted.microvmId);
    const deadline = Date.now() + 5_000;
    while (!(pids.every(isGone) && forgotten()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.ok(pids.every(isGone), "the instances' processes end");
    assert.ok(forgotten(), "the host no longer lists the instances");
    assert.equal((await svc.overNats.getMicrovm({ microvmIdentifier: ended.microvmId })).stateReason, "Operator");
  });
});

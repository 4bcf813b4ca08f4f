// A host process killed with SIGKILL, then started again with the same host id: its running
// instances died with it, its suspended one (a frozen process that cannot notice) is killed by
// the next host to start on the machine (another host id here), and no record stays RUNNING.
// Meanwhile that other host answers for the dead owner. A clean SIGTERM shutdown leaves no
// instance process either.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { natsClient } from "../client/index.ts";
import { instanceProcessesUnder } from "../vm-runtime/host/process-reclaim.ts";
import { SWEEP_KILL_TIMEOUT_MS } from "../vm-runtime/host/host-sweep.ts";
import { provisionMicrovmStores, startMicrovmHost } from "../vm-runtime/service/index.ts";
import {
  hostCgroupKey,
  hostGoneReason,
  hostWorkDir,
  MicrovmStore,
  REASON_PROCESS_GONE,
} from "../vm-runtime/service/index.ts";
import { connectNats, provisionBuckets, type NatsHandle } from "../platform/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";
import {
  assertNoInstanceLeft,
  cgroupsLeftOfHostKey,
  hostCgroupPids,
  isGone,
  isSuspended,
  policy,
  processState,
  waitForState,
  type MicrovmClient,
} from "./helpers/microvm.ts";

const defer = lifo(after);
const hostId = "reconcile-host";
let nats: TestNats;
let handle: NatsHandle;
let api: MicrovmClient;
let store: MicrovmStore;
let dataDir: string;
let workDir: string;

before(async () => {
  nats = await testNats(defer);
  handle = await connectNats({ ...nats.login("admin"), name: "reconcile-test" });
  defer(() => handle.close());
  api = natsClient(microvmApi, handle.nc);
  store = new MicrovmStore((await provisionBuckets(handle.nc)).microvms, handle.nc);
  await provisionMicrovmStores(handle.nc);
  dataDir = await mkdtemp(join(tmpdir(), "microvm-reconcile-"));
  defer(() => rm(dataDir, { recursive: true, force: true }));
  workDir = hostWorkDir(dataDir, hostId);
});
after(assertNoInstanceLeft);
after(() => assert.deepEqual(instanceProcessesUnder(workDir), [], "an instance of the host process was left running"));
// The last host closed removes its group: one still there is left over, with or without processes.
after(() => assert.equal(hostCgroupPids(workDir), undefined, "the host's cgroup was left (its pids listed)"));

async function startHostProcess(): Promise<ServiceProcess> {
  // The freezer's suspend (the bubblewrap sandbox's; gVisor's with snapshots off): a frozen
  // instance outlives its host. Snapshots survive it instead: microvm-snapshots.test.ts.
  const env = { ...nats.env(), DATA_DIR: dataDir, MICROVM_HOST_ID: hostId, MICROVM_SNAPSHOTS: "0" };
  const proc = await startServiceProcess(env, ["--role", "microvms"]);
  defer(() => proc.stop("SIGKILL"));
  return proc;
}

async function running(): Promise<{ microvmId: string; pid: number }> {
  const { microvmId } = await api.runMicrovm({ idlePolicy: policy() });
  await waitForState(api, microvmId, ["RUNNING"]);
  const record = (await store.read(microvmId))!.record;
  assert.equal(record.hostId, hostId);
  return { microvmId, pid: record.handle!.pid! };
}

/** The test sees these instances in the host's cgroups: a group found missing later is a group removed. */
function assertInHostCgroup(instances: readonly { microvmId: string; pid: number }[]): void {
  const pids = hostCgroupPids(workDir);
  assert.ok(pids, `no cgroup of the host was found for ${workDir}`);
  for (const { microvmId, pid } of instances) assert.ok(pids.includes(pid), `${microvmId} (pid ${pid}) is not in it`);
}

async function gone(pid: number, timeoutMs = 5_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (processState(pid) !== undefined && processState(pid) !== "Z" && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 20));
  return processState(pid) === undefined || processState(pid) === "Z";
}

describe("microvm reconcile", () => {
  it("microvm reconcile - after SIGKILL nothing of the old run keeps running and no record says RUNNING", async () => {
    const first = await startHostProcess();
    const [lost, orphan, suspended] = [await running(), await running(), await running()];
    await api.suspendMicrovm({ microvmIdentifier: suspended.microvmId });
    assert.ok(isSuspended(suspended.pid));
    assertInHostCgroup([lost, orphan, suspended]);

    // The killed run's bundles (and any launch snapshots in them) are removed by the next one.
    const firstRunDirs = (await readdir(workDir)).filter((name) => /^(sandbox|gvisor)-/.test(name));
    assert.equal(firstRunDirs.length, 1, `one work directory of the wall: ${firstRunDirs.join(", ")}`);
    await first.stop("SIGKILL");
    assert.ok(await gone(lost.pid), "a running instance exits with its host (stdin pipe closed)");
    assert.ok(await gone(orphan.pid));
    // Everything else of the old run in its cgroups (its walls booted ahead too) died with it;
    // the frozen instance cannot, until a host starts on this machine (another test's may: its
    // sweep then removes the groups, which were found above, so a group gone is a group swept).
    const stillThere = () => (hostCgroupPids(workDir) ?? []).filter((pid) => !isSuspended(pid));
    for (const deadline = Date.now() + 5_000; stillThere().length > 0 && Date.now() < deadline; )
      await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(stillThere(), [], "a process of the killed host outlived it");

    // Another host answers for the dead owner: terminate marks the record at once.
    const otherDir = await mkdtemp(join(tmpdir(), "microvm-other-"));
    defer(() => rm(otherDir, { recursive: true, force: true }));
    const other = await startMicrovmHost(handle.nc, {
      kv: store.kv,
      dataDir: otherDir,
      hostId: "other",
      sweepIntervalMs: 600_000,
    });
    // Its start swept what the dead host left: the frozen instance too (or a host of another
    // test did, whose sweep may still be killing it: within that sweep's bound).
    assert.ok(await gone(suspended.pid, SWEEP_KILL_TIMEOUT_MS), "the next host start killed the frozen instance");
    const answer = await api.terminateMicrovm({ microvmIdentifier: lost.microvmId });
    assert.equal(answer.state, "TERMINATED");
    assert.equal((await api.getMicrovm({ microvmIdentifier: lost.microvmId })).stateReason, hostGoneReason(hostId));
    await other.close();

    const second = await startHostProcess();
    const left = await readdir(workDir);
    assert.deepEqual(
      firstRunDirs.filter((name) => left.includes(name)),
      [],
      "the killed run's work directory is left",
    );
    assert.deepEqual(instanceProcessesUnder(workDir), []);
    assert.deepEqual(hostCgroupPids(workDir, { instancesOnly: true }), []);
    // The killed run's instance groups are removed, in every hierarchy.
    const oldGroups = cgroupsLeftOfHostKey(hostCgroupKey(workDir)).filter((dir) =>
      [lost, orphan, suspended].some((vm) => dir.split("/").pop()!.startsWith(`${vm.microvmId}-`)),
    );
    assert.deepEqual(oldGroups, [], "the killed run's cgroups are left");
    const reconciled = second.logs.find((entry) => entry.msg === "microvm host reconciled");
    assert.deepEqual([reconciled?.terminated, reconciled?.killed], [2, 0]);
    for (const vm of [orphan, suspended]) {
      const record = await api.getMicrovm({ microvmIdentifier: vm.microvmId });
      assert.deepEqual([record.state, record.stateReason], ["TERMINATED", REASON_PROCESS_GONE]);
    }
    const { items } = await api.listMicrovms({});
    assert.deepEqual(
      items.filter((item) => item.state !== "TERMINATED"),
      [],
    );
    assert.equal(await second.stop("SIGTERM"), 0);
  });

  it("microvm reconcile - SIGTERM terminates every instance of the host before it exits", async () => {
    const proc = await startHostProcess();
    const [a, b] = [await running(), await running()];
    await api.suspendMicrovm({ microvmIdentifier: b.microvmId });
    assertInHostCgroup([a, b]);
    assert.equal(await proc.stop("SIGTERM"), 0);
    assert.ok(isGone(a.pid));
    assert.ok(isGone(b.pid));
    assert.deepEqual(instanceProcessesUnder(workDir), []);
    assert.equal(hostCgroupPids(workDir), undefined, "a closed host removes its cgroup");
    for (const vm of [a, b]) {
      const record = (await store.read(vm.microvmId))!.record;
      assert.deepEqual([record.state, record.stateReason], ["TERMINATED", "HostShutdown"]);
    }
  });
});

// Suspended instances survive their host (gVisor, snapshots in the Object Store): a host
// process SIGKILLed while an instance is SUSPENDED is started again and adopts it (the record
// stays SUSPENDED, names a new endpoint), and an RPC with auto-resume answers with the state
// intact; a host that is gone for good leaves it to another host, where the resume lands.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Objm } from "@nats-io/obj";
import { natsClient } from "../client/index.ts";
import {
  hostWorkDir,
  MicrovmStore,
  provisionMicrovmStores,
  startMicrovmHost,
  type MicrovmRecord,
} from "../vm-runtime/service/index.ts";
import { connectNats, provisionBuckets, snapshotObjectBucket } from "../platform/index.ts";
import { microvmApi, nameToken } from "../schemas/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  hostCgroupPids,
  policy,
  removeHostCgroups,
  waitForState,
  type MicrovmClient,
} from "./helpers/microvm.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";
import { gvisorSkip } from "./helpers/providers.ts";

/** The counter image as a user pushes it: one module, state in memory and in a scratch file. */
const COUNTER_MODULE = `
import { appendFileSync, readFileSync } from "node:fs";
const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, fetch: d.fetch ?? (() => new Response("no", { status: 404 })) });
const file = (process.env.HOME || "/scratch") + "/counter.txt";
let count = 0;
const lines = () => { try { return readFileSync(file, "utf8").split("\\n").filter(Boolean).length; } catch { return 0; } };
export default defineImage({ methods: {
  increment: { handler: () => { count += 1; appendFileSync(file, count + "\\n"); return count; } },
  read: { handler: () => ({ memory: count, file: lines() }) },
} });
`;
type CounterShape = { increment(): Promise<number>; read(): Promise<{ memory: number; file: number }> };

const defer = lifo(after);
const skipGvisor = await gvisorSkip();

describe("microvm snapshot hosts", { skip: skipGvisor }, () => {
  let nats: TestNats;
  let api: MicrovmClient;
  let store: MicrovmStore;
  let dataDir: string;

  before(async () => {
    nats = await testNats(defer);
    const admin = await connectNats({ ...nats.login("admin"), name: "snapshot-hosts-test" });
    defer(() => admin.close());
    api = natsClient(microvmApi, admin.nc);
    store = new MicrovmStore((await provisionBuckets(admin.nc)).microvms, admin.nc);
    await provisionMicrovmStores(admin.nc);
    dataDir = await mkdtemp(join(tmpdir(), "microvm-snapshot-hosts-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
  });
  after(assertNoInstanceLeft);

  async function hostProcess(hostId: string): Promise<ServiceProcess> {
    const env = {
      ...nats.env(),
      DATA_DIR: dataDir,
      MICROVM_HOST_ID: hostId,
      MICROVM_PROVIDER: "gvisor",
      MICROVM_SNAPSHOTS: "1",
      MICROVM_WARM_INSTANCES: "0",
      MICROVM_MEMORY_MIB: "96",
    };
    const proc = await startServiceProcess(env, ["--role", "microvms"]);
    defer(() => proc.stop("SIGKILL"));
    return proc;
  }

  async function record(microvmId: string): Promise<MicrovmRecord> {
    const entry = await store.read(microvmId);
    assert.ok(entry, `record of ${microvmId}`);
    return entry.record;
  }

  async function counterAt(microvmId: string, endpoint: string) {
    const { authToken } = await api.createAuthToken({
      microvmIdentifier: microvmId,
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    return connectMicrovm<CounterShape>({ endpoint, authToken });
  }

  /** A counter instance counted to 3 and SUSPENDED into a snapshot. */
  async function suspendedCounter() {
    const run = await api.runMicrovm({ imageIdentifier: "counter", idlePolicy: policy({ autoResumeEnabled: true }) });
    await waitForState(api, run.microvmId, ["RUNNING"], 30_000);
    const stub = await counterAt(run.microvmId, run.endpoint);
    for (let i = 0; i < 3; i++) await stub.increment();
    assert.deepEqual(await stub.read(), { memory: 3, file: 3 });
    await api.suspendMicrovm({ microvmIdentifier: run.microvmId });
    await waitForState(api, run.microvmId, ["SUSPENDED"]);
    assert.ok((await record(run.microvmId)).checkpoint, "the snapshot is stored");
    return run;
  }

  /** Waits until the record names `hostId` and a new endpoint (an adoption), SUSPENDED all along. */
  async function adoptedBy(microvmId: string, hostId: string, oldEndpoint: string): Promise<MicrovmRecord> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const now = await record(microvmId);
      assert.equal(now.state, "SUSPENDED", `${microvmId} stays SUSPENDED (${now.stateReason ?? ""})`);
      if (now.hostId === hostId && now.endpoint !== oldEndpoint) return now;
      if (Date.now() > deadline) assert.fail(`${microvmId} was not adopted by ${hostId}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  it("microvm snapshot hosts - SIGKILLed while SUSPENDED, the host's next run adopts it and an RPC restores its state", async () => {
    const first = await hostProcess("host-a");
    await api.createImage({ name: "counter", module: COUNTER_MODULE });
    const vm = await suspendedCounter();
    await first.stop("SIGKILL");
    const second = await hostProcess("host-a");
    const reconciled = second.logs.find((entry) => entry.msg === "microvm host reconciled");
    assert.equal(reconciled?.kept, 1, "reconcile kept the suspended instance");
    const adopted = await adoptedBy(vm.microvmId, "host-a", vm.endpoint);
    const { endpoint } = await api.getMicrovm({ microvmIdentifier: vm.microvmId });
    assert.equal(endpoint, adopted.endpoint, "GetMicrovm names it");
    // An RPC through the new endpoint resumes it (auto-resume), with the state it had.
    const stub = await counterAt(vm.microvmId, endpoint);
    assert.deepEqual(await stub.read(), { memory: 3, file: 3 });
    assert.equal((await api.getMicrovm({ microvmIdentifier: vm.microvmId })).state, "RUNNING");
    assert.equal(await stub.increment(), 4);
    await api.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(api, vm.microvmId, ["TERMINATED"]);
    await second.stop("SIGTERM");
  });

  it("microvm snapshot hosts - stopped cleanly while SUSPENDED, the host leaves it to its next run", async () => {
    const first = await hostProcess("host-c");
    const vm = await suspendedCounter();
    assert.equal(await first.stop("SIGTERM"), 0);
    const left = await record(vm.microvmId);
    assert.deepEqual([left.state, left.stateReason], ["SUSPENDED", "SuspendRequested"], "a clean stop keeps it");
    const second = await hostProcess("host-c");
    const adopted = await adoptedBy(vm.microvmId, "host-c", vm.endpoint);
    const stub = await counterAt(vm.microvmId, adopted.endpoint);
    assert.deepEqual(await stub.read(), { memory: 3, file: 3 });
    await api.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(api, vm.microvmId, ["TERMINATED"]);
    await second.stop("SIGTERM");
  });

  it("microvm snapshot hosts - a host gone for good leaves its suspended instance to another, where the resume lands", async () => {
    const hostA = await hostProcess("host-b1");
    const vm = await suspendedCounter();
    await hostA.stop("SIGKILL");
    // Gone for good: no next run of host-b1 reclaims its cgroups.
    defer(() => removeHostCgroups(hostWorkDir(dataDir, "host-b1")));
    // Another host on the same NATS: its sweep finds host-b1 silent twice and adopts the instance.
    const handle = await connectNats({ ...nats.login("microvms"), name: "snapshot-hosts-b2" });
    defer(() => handle.close());
    const otherDir = await mkdtemp(join(tmpdir(), "microvm-snapshot-b2-"));
    defer(() => rm(otherDir, { recursive: true, force: true }));
    const hostB = await startMicrovmHost(handle.nc, {
      kv: store.kv,
      dataDir: otherDir,
      hostId: "host-b2",
      provider: "gvisor",
      snapshots: true,
      limits: { memoryMiB: 96, warmInstances: 0 },
      sweepIntervalMs: 200,
    });
    defer(() => hostB.close());
    const adopted = await adoptedBy(vm.microvmId, "host-b2", vm.endpoint);
    await api.resumeMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(api, vm.microvmId, ["RUNNING"], 30_000);
    assert.equal((await record(vm.microvmId)).hostId, "host-b2", "the resume landed on host-b2");
    assert.ok((hostCgroupPids(hostWorkDir(otherDir, "host-b2")) ?? []).length > 0, "host-b2 runs it");
    const stub = await counterAt(vm.microvmId, adopted.endpoint);
    assert.deepEqual(await stub.read(), { memory: 3, file: 3 });
    await api.terminateMicrovm({ microvmIdentifier: vm.microvmId });
    await waitForState(api, vm.microvmId, ["TERMINATED"]);
    const objects = await new Objm(handle.nc).create(snapshotObjectBucket);
    const info = await objects.info(`${nameToken("nats:internal")}/${nameToken(vm.microvmId)}`);
    assert.ok(!info || info.deleted, "no snapshot is left");
  });
});

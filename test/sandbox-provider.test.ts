// The sandbox provider through the instance proxy: the runtime over its unix socket, other
// ports forwarded inside the instance, the freezer for suspend, a dead instance answered 502,
// and the limits written to its cgroup. Real bubblewrap namespaces and cgroups.
import { after, before, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import {
  checkSandbox,
  createAuthToken,
  createInstanceProxy,
  createSandboxProvider,
  launchMicrovmInstance,
  type AllowedPort,
  type MicrovmHandle,
  type SandboxProvider,
} from "../vm-runtime/index.ts";
import { callInstance, rpc } from "./helpers/instance-rpc.ts";
import { isSuspended } from "./helpers/microvm.ts";
import { testImages } from "./images/paths.ts";

const key = randomBytes(32);
let provider: SandboxProvider;

before(async () => {
  provider = await createSandboxProvider({
    hostKey: `provider-test-${process.pid}`,
    cpus: 0.25,
    pids: 32,
    memoryMiB: 96,
    scratchMiB: 8,
  });
});
after(() => provider.close());

async function start(t: TestContext, id: string): Promise<MicrovmHandle> {
  const handle = await provider.start({ microvmId: id, image: testImages.hostile });
  t.after(() => provider.terminate(handle, 200));
  return handle;
}

async function proxyTo(t: TestContext, handle: MicrovmHandle): Promise<string> {
  const proxy = createInstanceProxy({
    microvmId: handle.microvmId,
    tokenKey: key,
    state: () => "RUNNING",
    resolveUpstream: (port) => provider.upstream(handle, port),
    upstreamHeaders: () => handle.upstreamHeaders,
    upstreamTimeoutMs: 2_000,
  });
  const endpoint = await proxy.listen();
  t.after(() => proxy.close());
  return `http://${endpoint}`;
}

const token = (microvmId: string, allowedPorts: AllowedPort[]) =>
  createAuthToken({ microvmId, expirationInMinutes: 1, allowedPorts }, key).token;

test("sandbox provider - RPC through the proxy reaches the runtime over its socket", async (t) => {
  const vm = await start(t, "sp-rpc");
  assert.match(vm.socketPath ?? "", /^\/proc\/\d+\/root\/run\/microvm\/runtime\.sock$/);
  const base = await proxyTo(t, vm);
  const response = await fetch(`${base}/__rpc__/ping`, {
    method: "POST",
    body: "[]",
    headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 8080 }]) },
  });
  assert.equal(response.status, 200);
  assert.equal(await response.json(), "pong");
});

test("sandbox provider - another port of the instance is reached through the runtime", async (t) => {
  const vm = await start(t, "sp-port");
  assert.equal(await rpc(vm, "serve", [3000]), "serving");
  const base = await proxyTo(t, vm);
  const response = await fetch(`${base}/hello?x=1`, {
    headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 3000 }]), "X-aws-proxy-port": "3000" },
  });
  assert.equal(response.status, 200);
  assert.equal(await response.text(), "port 3000 /hello?x=1");
});

test("sandbox provider - a caller's own x-instance-port cannot pick a port its token lacks", async (t) => {
  const vm = await start(t, "sp-forged-port");
  assert.equal(await rpc(vm, "serve", [3000]), "serving");
  const base = await proxyTo(t, vm);
  const response = await fetch(`${base}/__rpc__/ping`, {
    method: "POST",
    body: "[]",
    headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 8080 }]), "x-instance-port": "3000" },
  });
  assert.equal(await response.json(), "pong", "the request went to port 3000");
});

test("sandbox provider - suspend freezes the whole instance and resume thaws it", async (t) => {
  const vm = await start(t, "sp-freeze");
  await provider.suspend(vm);
  assert.ok(isSuspended(vm.pid!));
  const group = provider.cgroupOf(vm)!;
  assert.ok(
    group.pids().every((pid) => isSuspended(pid)),
    "a process of the instance was not frozen",
  );
  await provider.resume(vm);
  assert.ok(!isSuspended(vm.pid!));
  assert.equal(await rpc(vm, "ping"), "pong");
});

test("sandbox provider - a dead instance has no upstream, so the proxy answers 502", async (t) => {
  const vm = await start(t, "sp-dead");
  const base = await proxyTo(t, vm);
  process.kill(vm.pid!, "SIGKILL");
  const deadline = Date.now() + 5_000;
  while ((await provider.isAlive(vm)) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(provider.upstream(vm, 8080), undefined);
  const response = await fetch(`${base}/__rpc__/ping`, {
    method: "POST",
    body: "[]",
    headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 8080 }]) },
  });
  assert.equal(response.status, 502);
});

test("sandbox provider - the instance's cgroup carries its limits", async (t) => {
  const vm = await start(t, "sp-limits");
  const group = provider.cgroupOf(vm)!;
  const read = (controller: string, file: string) =>
    readFileSync(
      `/sys/fs/cgroup/${controller}/typed-service-microvms/provider-test-${process.pid}/${group.name}/${file}`,
      "utf8",
    ).trim();
  if (provider.cgroupVersion === 1) {
    assert.equal(read("memory", "memory.limit_in_bytes"), String((96 + 8 + 128) * 2 ** 20));
    assert.equal(read("cpu", "cpu.cfs_quota_us"), "25000");
    assert.equal(read("pids", "pids.max"), "32");
  } else {
    t.diagnostic("cgroup v2: limits checked by the escape tests");
  }
  const { uid, env } = await rpc<{ uid: number; env: string[] }>(vm, "whoami");
  assert.equal(uid, 1000);
  assert.ok(!env.some((name) => /SECRET|NATS|TOKEN/.test(name)), `environment: ${env.join(",")}`);
});

test("sandbox provider - an instance killed at its memory limit becomes FAILED with the reason", async (t) => {
  const instance = await launchMicrovmInstance({
    microvmId: "sp-oom",
    image: testImages.hostile,
    idlePolicy: { maxIdleDurationSeconds: 600, suspendedDurationSeconds: 600, autoResumeEnabled: false },
    provider,
    tokenKey: key,
  });
  t.after(() => instance.close());
  assert.equal(await instance.waitForState(["RUNNING"], 15_000), "RUNNING");
  const handle = instance.actor.getSnapshot().context.handle!;
  await callInstance(handle, "allocate", [], 30_000).catch(() => undefined);
  assert.equal(await instance.waitForState(["FAILED"], 15_000), "FAILED");
  assert.match(instance.actor.getSnapshot().context.stateReason ?? "", /^InstanceExited: out of memory/);
});

test("sandbox provider - the check names what is missing when bubblewrap is absent", async () => {
  const check = await checkSandbox({ bwrap: "/nonexistent/bwrap" });
  assert.equal(check.ok, false);
  assert.match(
    check.ok ? "" : check.reason,
    /bubblewrap is not installed \(Debian\/Ubuntu: apt-get install bubblewrap\)/,
  );
  assert.deepEqual(await checkSandbox(), { ok: true, cgroupVersion: provider.cgroupVersion });
});

// Each isolating provider (bubblewrap sandbox, gVisor) through the instance proxy: the runtime
// over its socket, other ports forwarded inside, the freezer for suspend, a dead instance
// answered 502, the limits written to its cgroups, a host uid per instance, and a runtime
// socket the instance replaces or plants that never leads the host anywhere else.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  checkGvisor,
  checkSandbox,
  createAuthToken,
  createInstanceProxy,
  launchMicrovmInstance,
  type IsolatedProvider,
  type MicrovmHandle,
} from "../vm-runtime/service/index.ts";
import type { AllowedPort } from "../schemas/index.ts";
import { callInstance, rpc } from "./helpers/instance-rpc.ts";
import { hostMemoryLimitHits, isSuspended } from "./helpers/microvm.ts";
import { isolatedProviders, type ProviderKind } from "./helpers/providers.ts";
import { fillerModule } from "./images/filler-module.ts";
import { testImages } from "./images/paths.ts";

const run = promisify(execFile);
const key = randomBytes(32);
const MiB = 2 ** 20;
const token = (microvmId: string, allowedPorts: AllowedPort[]) =>
  createAuthToken({ microvmId, expirationInMinutes: 1, allowedPorts }, key).token;

for (const kind of await isolatedProviders()) describeProvider(kind);

function describeProvider(kind: ProviderKind): void {
  const hostKey = `provider-test-${kind.name}-${process.pid}`;
  const totalMemoryMiB = 1536;
  let provider: IsolatedProvider;

  describe(`${kind.name} provider`, () => {
    before(async () => {
      // The permission model is off: each test measures the wall alone.
      provider = await kind.create({
        hostKey,
        cpus: 0.25,
        pids: 32,
        memoryMiB: 96,
        scratchMiB: 8,
        totalMemoryMiB,
        permissions: false,
      });
    });
    after(() => provider.close());

    async function start(t: TestContext, id: string, image = testImages.hostile): Promise<MicrovmHandle> {
      const handle = await provider.start({ microvmId: id, image });
      t.after(() => provider.terminate(handle, 200));
      return handle;
    }

    async function proxyTo(t: TestContext, handle: MicrovmHandle): Promise<string> {
      const proxy = createInstanceProxy({
        instance: {
          microvmId: handle.microvmId,
          state: () => "RUNNING",
          upstream: (port) => provider.upstream(handle, port),
          upstreamHeaders: () => handle.upstreamHeaders,
        },
        tokenKey: key,
        upstreamTimeoutMs: 2_000,
      });
      const endpoint = await proxy.listen();
      t.after(() => proxy.close());
      return `http://${endpoint}`;
    }

    const proxiedPing = (base: string, microvmId: string) =>
      fetch(`${base}/__rpc__/ping`, {
        method: "POST",
        body: "[]",
        headers: { "X-aws-proxy-auth": token(microvmId, [{ port: 8080 }]) },
      });

    test(`${kind.name} provider - RPC through the proxy reaches the runtime over its socket`, async (t) => {
      const vm = await start(t, "sp-rpc");
      assert.match(vm.socketPath ?? "", /^\/proc\/self\/fd\/\d+$/);
      const response = await proxiedPing(await proxyTo(t, vm), vm.microvmId);
      assert.equal(response.status, 200);
      assert.equal(await response.json(), "pong");
    });

    test(`${kind.name} provider - another port of the instance is reached through the runtime`, async (t) => {
      const vm = await start(t, "sp-port");
      assert.equal(await rpc(vm, "serve", [3000]), "serving");
      const base = await proxyTo(t, vm);
      const response = await fetch(`${base}/hello`, {
        headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 3000 }]), "X-aws-proxy-port": "3000" },
      });
      assert.equal(response.status, 200);
      assert.equal(await response.text(), "port 3000 /hello");
    });

    test(`${kind.name} provider - a caller's own x-instance-port cannot pick a port its token lacks`, async (t) => {
      const vm = await start(t, "sp-header");
      assert.equal(await rpc(vm, "serve", [3001]), "serving");
      const base = await proxyTo(t, vm);
      const response = await fetch(`${base}/hello`, {
        headers: { "X-aws-proxy-auth": token(vm.microvmId, [{ port: 8080 }]), "x-instance-port": "3001" },
      });
      assert.notEqual(await response.text(), "port 3001 /hello");
    });

    test(`${kind.name} provider - suspend freezes the whole instance and resume thaws it`, async (t) => {
      const vm = await start(t, "sp-freeze");
      await provider.suspend(vm);
      const group = provider.cgroupOf(vm)!;
      assert.ok(group.pids().length > 0, "the instance's cgroup holds no process");
      assert.ok(
        group.pids().every((pid) => isSuspended(pid)),
        "a process of the instance was not frozen",
      );
      await provider.resume(vm);
      assert.ok(!isSuspended(vm.pid!));
      assert.equal(await rpc(vm, "ping"), "pong");
    });

    test(`${kind.name} provider - a dead instance has no upstream, so the proxy answers 502`, async (t) => {
      const vm = await start(t, "sp-dead");
      const base = await proxyTo(t, vm);
      await provider.cgroupOf(vm)!.kill();
      const deadline = Date.now() + 5_000;
      while ((await provider.isAlive(vm)) && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 20));
      assert.equal(provider.upstream(vm, 8080), undefined);
      assert.equal((await proxiedPing(base, vm.microvmId)).status, 502);
    });

    test(`${kind.name} provider - the instance's cgroup and its host's carry their limits`, async (t) => {
      const vm = await start(t, "sp-limits");
      const group = provider.cgroupOf(vm)!;
      const instanceMemory = String((96 + 8 + 128 + kind.overheadMiB) * MiB);
      const v1 = (controller: string, file: string, name = group.name) =>
        readFileSync(join("/sys/fs/cgroup", controller, "typed-service-microvms", hostKey, name, file), "utf8").trim();
      const v2 = (file: string, name = group.name) =>
        readFileSync(join("/sys/fs/cgroup/typed-service-microvms", hostKey, name, file), "utf8").trim();
      if (provider.cgroupVersion === 1) {
        assert.ok(existsSync("/sys/fs/cgroup/memory/cgroup.procs"), "cgroup v1 reported without a memory hierarchy");
        assert.equal(v1("memory", "memory.limit_in_bytes"), instanceMemory);
        assert.equal(v1("cpu", "cpu.cfs_quota_us"), "25000");
        assert.equal(v1("pids", "pids.max"), String(32 + kind.overheadPids));
        assert.equal(v1("memory", "memory.limit_in_bytes", ""), String(totalMemoryMiB * MiB));
      } else {
        assert.equal(provider.cgroupVersion, 2);
        assert.equal(v2("memory.max"), instanceMemory);
        assert.equal(v2("cpu.max"), "25000 100000");
        assert.equal(v2("pids.max"), String(32 + kind.overheadPids));
        assert.equal(v2("memory.max", ""), String(totalMemoryMiB * MiB));
      }
      assert.ok(group.pids().length > 0, "the instance runs outside its cgroup");
    });

    test(`${kind.name} provider - the instance sees its own limits: its memory cap as its total memory, its CPU quota as its CPU count`, async (t) => {
      const dir = await mkdtemp(join(tmpdir(), "limits-image-"));
      t.after(() => rm(dir, { recursive: true, force: true }));
      await writeFile(join(dir, "filler.mjs"), fillerModule);
      const vm = await start(t, "sp-sees-limits", join(dir, "filler.mjs"));
      const seen = await rpc<{
        totalmem: number;
        parallelism: number;
        imported: number;
        cpus: number;
        hardwareConcurrency: number;
      }>(vm, "limits");
      // Its cgroup's cap (heap 96, scratch 8, node's headroom, the wall's own): the host's is
      // 1.5 GiB and more.
      assert.equal(seen.totalmem, (96 + 8 + 128 + kind.overheadMiB) * MiB);
      // Its quota (0.25 cores) rounded up, however node is asked; it may still run on every
      // CPU of the host (its cgroup's), the quota bounding its time.
      const counted = { parallelism: 1, imported: 1, cpus: 1, hardwareConcurrency: 1 };
      assert.deepEqual({ ...seen, totalmem: undefined }, { ...counted, totalmem: undefined });
      assert.deepEqual(provider.cgroupOf(vm)!.limits(), {
        memoryBytes: seen.totalmem,
        cpus: availableParallelism(),
      });
      t.diagnostic(`${kind.name}: ${JSON.stringify(seen)} (the host: ${availableParallelism()} CPUs)`);
    });

    test(`${kind.name} provider - no variable of the host reaches the instance`, async (t) => {
      const planted = { MICROVM_TOKEN_SECRET: randomBytes(8).toString("hex"), NATS_PASSWORD: "planted" };
      Object.assign(process.env, planted);
      t.after(() => {
        for (const name of Object.keys(planted)) delete process.env[name];
      });
      const vm = await start(t, "sp-env");
      const { uid, env } = await rpc<{ uid: number; env: string[] }>(vm, "whoami");
      for (const name of Object.keys(planted)) assert.ok(!env.includes(name), `${name} reached the instance`);
      assert.ok(env.includes("MICROVM_ID"), `the instance's own variables are missing: ${env.join(",")}`);
      // bubblewrap maps the host uid to 1000 inside; gVisor's own kernel shows the host uid itself.
      assert.equal(uid, kind.name === "sandbox" ? 1000 : provider.uidOf(vm));
    });

    test(`${kind.name} provider - two instances run as different host uids, and neither's uid can signal or trace the other`, async (t) => {
      const [a, b] = [await start(t, "sp-uid-a"), await start(t, "sp-uid-b")];
      const [uidA, uidB] = [provider.uidOf(a)!, provider.uidOf(b)!];
      assert.ok(uidA >= 1_200_000_000 && uidB >= 1_200_000_000, `uids ${uidA}, ${uidB}`);
      assert.notEqual(uidA, uidB);
      const pidsB = provider.cgroupOf(b)!.pids();
      assert.ok(pidsB.length > 0);
      const fromA = await tryAs(uidA, pidsB);
      for (const [pid, outcome] of Object.entries(fromA))
        assert.deepEqual(
          outcome,
          { signal: "EPERM", mem: "EACCES" },
          `uid ${uidA} reached pid ${pid} of the other instance`,
        );
      if (kind.name === "sandbox") {
        // Positive control: B's own uid does reach B's processes, so the refusals above are the uids'.
        const own = Object.values(
          await tryAs(
            uidB,
            pidsB.filter((pid) => statusUid(pid) === uidB),
          ),
        );
        assert.ok(own.length > 0, "no process of B runs as B's uid");
        assert.ok(
          own.every((outcome) => outcome.signal === "ok"),
          JSON.stringify(own),
        );
      } else {
        // gVisor: image code runs inside the Sentry; no host process has the instance's uid at all.
        assert.deepEqual(
          pidsB.filter((pid) => statusUid(pid) === uidB),
          [],
        );
      }
    });

    test(`${kind.name} provider - a symlink or socket planted at the runtime's socket leads the host nowhere else`, async (t) => {
      const target = await listeningSocket(t);
      const vm = await start(t, "sp-plant");
      const base = await proxyTo(t, vm);
      assert.equal(await rpc(vm, "plantSocket", ["link", target.path]), "planted");
      let response = await proxiedPing(base, vm.microvmId);
      assert.deepEqual([response.status, await response.json()], [200, "pong"]);
      assert.equal(await rpc(vm, "plantSocket", ["socket", ""]), "planted");
      response = await proxiedPing(base, vm.microvmId);
      assert.deepEqual([response.status, await response.json()], [200, "pong"]);
      assert.equal(target.connections(), 0, "the host followed the planted symlink");
    });

    test(`${kind.name} provider - an instance that plants a symlink before its runtime binds does not start, and the host connects nowhere`, async (t) => {
      const target = await listeningSocket(t);
      const dir = await mkdtemp(join(tmpdir(), "plant-image-"));
      t.after(() => rm(dir, { recursive: true, force: true }));
      const image = join(dir, "plant-early.ts");
      const imageApi = new URL("../vm-runtime/image.ts", import.meta.url).pathname;
      await writeFile(
        image,
        `import { symlinkSync } from "node:fs";\n` +
          `import { defineImage } from ${JSON.stringify(imageApi)};\n` +
          `symlinkSync(${JSON.stringify(target.path)}, "/run/microvm/runtime.sock");\n` +
          `export default defineImage({ methods: { ping: { handler: () => "pong" } } });\n`,
      );
      await assert.rejects(provider.start({ microvmId: "sp-plant-early", image }), /did not become ready/);
      assert.equal(target.connections(), 0, "the host followed the planted symlink");
    });

    test(`${kind.name} provider - an instance killed at its memory limit becomes FAILED with the reason`, async (t) => {
      const instance = await launchMicrovmInstance({
        microvmId: "sp-oom",
        image: testImages.hostile,
        idlePolicy: { maxIdleDurationSeconds: 600, suspendedDurationSeconds: 600, autoResumeEnabled: false },
        provider,
        tokenKey: key,
      });
      t.after(() => instance.close());
      assert.equal(await instance.waitForState(["RUNNING"], 15_000), "RUNNING");
      const bystander = await start(t, "sp-oom-bystander");
      const handle = instance.actor.getSnapshot().context.handle!;
      const hostHits = hostMemoryLimitHits(hostKey);
      await callInstance(handle, "allocate", [], 30_000).catch(() => undefined);
      assert.equal(await instance.waitForState(["FAILED"], 15_000), "FAILED");
      assert.match(instance.actor.getSnapshot().context.stateReason ?? "", /^InstanceExited: out of memory/);
      // The host's cap (several times the instance's limit) was never reached: the instance's own limit acted.
      assert.equal(hostMemoryLimitHits(hostKey), hostHits, "the host's memory cap was reached, not the instance's own");
      assert.equal(await rpc(bystander, "ping"), "pong");
    });
  });
}

test("sandbox provider - the check names what is missing when bubblewrap is absent", async () => {
  const check = await checkSandbox({ bwrap: "/nonexistent/bwrap" });
  assert.equal(check.ok, false);
  assert.match(
    check.ok ? "" : check.reason,
    /bubblewrap is not installed \(Debian\/Ubuntu: apt-get install bubblewrap\)/,
  );
  assert.equal((await checkSandbox()).ok, true);
});

test("gvisor provider - the check names what is missing when runsc is absent", async () => {
  const check = await checkGvisor("/nonexistent/runsc");
  assert.equal(check.ok, false);
  assert.match(check.ok ? "" : check.reason, /runsc is not installed at \/nonexistent\/runsc/);
});

/** A host unix socket server that counts the connections it gets. */
async function listeningSocket(t: TestContext): Promise<{ path: string; connections(): number }> {
  const dir = await mkdtemp(join(tmpdir(), "plant-target-"));
  const path = join(dir, "host.sock");
  let count = 0;
  const server: Server = createServer((socket) => {
    count += 1;
    socket.destroy();
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  t.after(async () => {
    await new Promise((resolve) => server.close(resolve));
    await rm(dir, { recursive: true, force: true });
  });
  return { path, connections: () => count };
}

/** The real uid of a host process (from /proc), or undefined when it is gone. */
function statusUid(pid: number): number | undefined {
  try {
    return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
  } catch {
    return undefined;
  }
}

interface Reach {
  readonly signal: string;
  readonly mem: string;
}

/**
 * From a host process running as `uid`: kill(pid, 0) and opening /proc/<pid>/mem (ptrace's access check) of each pid.
 */
async function tryAs(uid: number, pids: readonly number[]): Promise<Record<string, Reach>> {
  const script = `
    const { openSync, closeSync } = require("node:fs");
    const out = {};
    for (const pid of ${JSON.stringify(pids)}) {
      const attempt = (fn) => { try { fn(); return "ok"; } catch (e) { return e.code; } };
      out[pid] = {
        signal: attempt(() => process.kill(pid, 0)),
        mem: attempt(() => closeSync(openSync("/proc/" + pid + "/mem", "r"))),
      };
    }
    console.log(JSON.stringify(out));`;
  const { stdout } = await run("setpriv", [
    `--reuid=${uid}`,
    `--regid=${uid}`,
    "--clear-groups",
    "--",
    process.execPath,
    "-e",
    script,
  ]);
  return JSON.parse(stdout) as Record<string, Reach>;
}

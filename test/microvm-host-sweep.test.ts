// A microVM host killed with SIGKILL while groups of its were frozen (a suspended instance, and
// the wall it had booted ahead, frozen as a host killed in the middle of a group kill leaves
// it): on cgroup v1 nothing of those can end, not even on SIGKILL, until thawed. The next host
// to start on the machine, whatever its key, sweeps it: once that start has returned, no
// process, cgroup, run directory or lock of the killed host is left. A live host's are never
// touched, whatever its lock file says; a host started again with the dead one's key kills its
// leftovers itself (reclaim). Once per isolating provider (bubblewrap, gVisor), each
// host a real child process; the hosts of a test share a run directory of their own, so that
// hosts of other test files (which sweep too) neither see nor disturb them.
import { after, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync } from "node:fs";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { cgroupVersion } from "../vm-runtime/host/cgroups.ts";
import { isProcessAlive } from "../vm-runtime/host/proc.ts";
import { WARM_PREFIX } from "../vm-runtime/host/isolated-boot.ts";
import { clearHostKey, cgroupsLeftOfHostKey, describeProcess, freezeGroup, hostKeyMembers } from "./helpers/microvm.ts";
import { isolatedProviders, type ProviderKind } from "./helpers/providers.ts";
import { testImages } from "./images/paths.ts";

const walls = process.getuid?.() === 0 ? await isolatedProviders() : [];
if (walls.length === 0) console.log("# skipped microvm host sweep: needs root to make cgroups");
let serial = 0;

for (const wall of walls) sweepSuite(wall);

function sweepSuite(wall: ProviderKind): void {
  describe(`microvm host sweep - ${wall.name}`, () => {
    let runDir: string;
    after(() => (runDir ? rm(runDir, { recursive: true, force: true }) : undefined));

    /** A run directory of this suite's hosts alone: instance uids pass through it (0711). */
    async function sharedRunDir(): Promise<string> {
      runDir ??= await mkdtemp(join(tmpdir(), `host-sweep-${wall.name}-`));
      await chmod(runDir, 0o711);
      return runDir;
    }

    /** Options of a host of this suite (`hostKey` unique per process and call). */
    async function hostOptions(name: string) {
      const hostKey = `sweep-${wall.name}-${name}-${process.pid}-${serial++}`;
      const dir = await sharedRunDir();
      return { hostKey, runDir: dir, workDir: join(dir, `work-${hostKey}`), memoryMiB: 64, scratchMiB: 16 };
    }

    /** A host process with one suspended (frozen) instance and a wall booted ahead for the next one. */
    async function frozenHost(t: TestContext, options: object & { hostKey: string }): Promise<ChildProcess> {
      const dir = await mkdtemp(join(tmpdir(), "sweep-host-"));
      t.after(() => rm(dir, { recursive: true, force: true }));
      const script = join(dir, "host.mjs");
      const index = new URL("../vm-runtime/service/index.ts", import.meta.url).href;
      const create = wall.name === "gvisor" ? "createGvisorProvider" : "createSandboxProvider";
      await writeFile(
        script,
        `import { ${create} } from ${JSON.stringify(index)};\n` +
          `const provider = await ${create}({ ...${JSON.stringify(options)}, ` +
          `warmInstances: 1, permissions: false });\n` +
          `const handle = await provider.start({ microvmId: "frozen", ` +
          `image: ${JSON.stringify(testImages.counter)} });\n` +
          `await provider.suspend(handle);\n` +
          // Up once the wall booted ahead holds no boot slot: its runtime waits for an image.
          `while (provider.boots().running + provider.boots().waiting > 0) ` +
          `await new Promise((r) => setTimeout(r, 20));\n` +
          `console.log("up");\n` +
          `setInterval(() => undefined, 1000);\n`,
      );
      const host = spawn(process.execPath, ["--import", "tsx", script], { stdio: ["ignore", "pipe", "inherit"] });
      t.after(() => host.kill("SIGKILL"));
      await new Promise<void>((resolve, reject) => {
        createInterface({ input: host.stdout! }).once("line", () => resolve());
        host.once("exit", (code) => reject(new Error(`the host exited (${code}) before it was up`)));
      });
      return host;
    }

    /** Freezes the host's wall booted ahead, as a host killed in the middle of its group kill leaves it. */
    function freezeWarmWall(hostKey: string): void {
      const warm = cgroupsLeftOfHostKey(hostKey)
        .map((dir) => dir.split("/").pop()!)
        .find((name) => name.startsWith(WARM_PREFIX));
      assert.ok(warm, "the host has a wall booted ahead");
      freezeGroup(hostKey, warm);
    }

    test(`microvm host sweep - ${wall.name} - nothing of a host SIGKILLed with frozen groups is left once the next host has started`, async (t) => {
      const killed = await hostOptions("killed");
      const host = await frozenHost(t, killed);
      freezeWarmWall(killed.hostKey);
      const members = hostKeyMembers(killed.hostKey);
      assert.ok(members.size >= 2, `the killed host's groups hold its instance and warm wall: ${members.size}`);
      host.kill("SIGKILL");
      await once(host, "exit");
      const alive = () => [...members].filter(([pid, startTime]) => isProcessAlive(pid, startTime)).map(([pid]) => pid);
      // What the sweep is for: on v1 a frozen process cannot end, even SIGKILLed with its host.
      if (cgroupVersion() === 1) assert.ok(alive().length > 0, "frozen processes outlive their host until a sweep");

      // The bound: the next host's start on this machine (another key), which sweeps first.
      const began = performance.now();
      const next = await wall.create({ ...(await hostOptions("next")), warmInstances: 0 });
      t.diagnostic(`the next host started, sweeping, in ${Math.round(performance.now() - began)} ms`);
      const swept = next.swept;
      await next.close();
      const left = {
        processes: alive().map(describeProcess),
        cgroups: cgroupsLeftOfHostKey(killed.hostKey),
        runDir: existsSync(join(killed.runDir, killed.hostKey)),
        lock: existsSync(join(killed.runDir, `${killed.hostKey}.lock`)),
      };
      await clearHostKey(killed.hostKey);
      await rm(join(killed.runDir, killed.hostKey), { recursive: true, force: true });
      await rm(join(killed.runDir, `${killed.hostKey}.lock`), { force: true });

      assert.deepEqual(left, { processes: [], cgroups: [], runDir: false, lock: false }, "left of the killed host");
      const report = swept.find((entry) => entry.hostKey === killed.hostKey);
      assert.deepEqual(report?.left, undefined);
      assert.deepEqual(
        [...(report?.pids ?? [])].sort((a, b) => a - b),
        [...members.keys()].sort((a, b) => a - b),
        "the sweep reports the pids it killed",
      );
    });

    test(`microvm host sweep - ${wall.name} - a live host is never swept, whatever its lock file says`, async (t) => {
      const live = await hostOptions("live");
      const host = await frozenHost(t, live);
      const members = hostKeyMembers(live.hostKey);
      // Its record names a process long gone: only the lock, which the live host holds, decides.
      const lockFile = join(live.runDir, `${live.hostKey}.lock`);
      await writeFile(lockFile, JSON.stringify({ pid: 999_999_999, startTime: 1, cgroupParent: "elsewhere" }));
      const next = await wall.create({ ...(await hostOptions("beside")), warmInstances: 0 });
      const swept = next.swept;
      await next.close();
      const kept = {
        processes: [...members].filter(([pid, startTime]) => isProcessAlive(pid, startTime)).length,
        cgroups: cgroupsLeftOfHostKey(live.hostKey).length > 0,
        runDir: existsSync(join(live.runDir, live.hostKey)),
        lock: existsSync(lockFile),
      };
      host.kill("SIGKILL");
      await once(host, "exit");
      await clearHostKey(live.hostKey);
      await rm(join(live.runDir, live.hostKey), { recursive: true, force: true });
      await rm(lockFile, { force: true });

      assert.deepEqual(
        swept.map((entry) => entry.hostKey).filter((key) => key === live.hostKey),
        [],
      );
      assert.deepEqual(kept, { processes: members.size, cgroups: true, runDir: true, lock: true });
    });

    test(`microvm host sweep - ${wall.name} - a host started again with its own key kills its frozen leftovers itself`, async (t) => {
      const killed = await hostOptions("again");
      const host = await frozenHost(t, killed);
      freezeWarmWall(killed.hostKey);
      const members = hostKeyMembers(killed.hostKey);
      host.kill("SIGKILL");
      await once(host, "exit");
      // Its own key is claimed, not swept: its reclaim kills them (what reconcile reports as killed).
      const again = await wall.create({ ...killed, workDir: `${killed.workDir}-again`, warmInstances: 0 });
      const reclaimed = await again.reclaim().finally(() => again.close());
      const left = cgroupsLeftOfHostKey(killed.hostKey);
      await clearHostKey(killed.hostKey);

      assert.deepEqual(left, [], "cgroups of the killed run are left");
      assert.deepEqual(
        reclaimed.flatMap((instance) => instance.pids).sort((a, b) => a - b),
        [...members.keys()].sort((a, b) => a - b),
        "reclaim reports every process it killed",
      );
    });
  });
}

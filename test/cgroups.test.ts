// An instance's end, on this machine's real cgroups: the kernel drops a process from
// `cgroup.procs` once all its threads began to exit, while it may still run (a pid namespace's
// init waits there until its namespace has ended: gVisor's sandbox is one). An empty group
// is then not an ended instance; the processes noted while it ran say when it has ended.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { cgroupVersion, openHostCgroups, type HostCgroups, type InstanceCgroup } from "../vm-runtime/host/cgroups.ts";
import { membersEnded, noteMembers, type Tracked } from "../vm-runtime/host/isolated-walls.ts";
import { readProcStat } from "../vm-runtime/host/proc.ts";
import { pollUntil } from "../vm-runtime/host/provider-util.ts";

const version = cgroupVersion();
const skip =
  process.getuid?.() !== 0
    ? "needs root to make cgroups"
    : version !== 1
      ? "needs cgroup v1's freezer, which holds a killed task until thawed (v2's lets SIGKILL through)"
      : false;
if (skip) console.log(`# skipped cgroups: ${skip}`);

const limits = { cpus: 0.5, memoryBytes: 64 * 2 ** 20, pids: 8 };
/** Shell words that move the running shell into `group` (`0` is the writer itself, in any pid namespace). */
const joinGroup = (group: InstanceCgroup) => group.procsFiles.map((file) => `echo 0 > ${file}`).join("; ");

describe("cgroups", { skip }, () => {
  let host: HostCgroups;
  before(async () => {
    host = await openHostCgroups(`cgroups-test-${process.pid}`, { cpus: 1, memoryBytes: 256 * 2 ** 20 });
  });
  after(() => host?.remove());

  it("cgroups - a pid namespace's init out of cgroup.procs but still running is no ended member", async () => {
    const group = await host.create("ns-init", limits);
    const held = await host.create("ns-child", limits);
    // unshare (outside both groups) forks the namespace's init into `group`; the init starts a
    // child that moves itself into `held`, and waits for it.
    const child = `sh -c '${joinGroup(held)}; echo child; exec sleep 600'`;
    const init = spawn("unshare", ["--pid", "--fork", "sh", "-c", `${joinGroup(group)}; ${child} & wait`], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const exited = once(init, "exit");
    try {
      await once(init.stdout, "data");
      assert.ok(await pollUntil(() => held.pids().length === 1 && group.pids().length === 1, 10_000));
      const [initPid] = group.pids() as [number];
      const entry = { cgroup: group, members: new Map() } as unknown as Tracked;
      noteMembers(entry);
      assert.deepEqual([...entry.members.keys()], [initPid]);
      assert.equal(membersEnded(entry), false);
      // Frozen by cgroup v1, the killed child cannot end, so its init waits for it.
      await held.freeze();
      await group.kill(10_000);
      assert.deepEqual(group.pids(), [], "the group's kill saw it empty");
      assert.notEqual(readProcStat(initPid)?.state, "Z", "yet its init has not ended");
      assert.equal(membersEnded(entry), false, "and is not taken for ended");
      await held.thaw();
      assert.ok(await pollUntil(() => membersEnded(entry), 10_000), "it ends once its namespace has");
    } finally {
      await held.thaw().catch(() => undefined);
      await held.kill().catch(() => undefined);
      init.kill("SIGKILL");
      await exited;
      await group.remove();
      await held.remove();
    }
  });
});

// An instance's cgroup, on this machine's real hierarchy: a kill resolves only once every task
// the group had is reaped, not once `cgroup.procs` is empty (a process whose threads all began
// to exit leaves that list while it may still run, and a zombie is no member of it).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { once } from "node:events";
import { cgroupVersion, openHostCgroups, type HostCgroups } from "../vm-runtime/host/cgroups.ts";
import { pollUntil, within } from "../vm-runtime/host/provider-util.ts";

const skip =
  process.getuid?.() !== 0
    ? "needs root to make cgroups"
    : cgroupVersion() === undefined
      ? "no usable cgroup hierarchy under /sys/fs/cgroup"
      : false;
if (skip) console.log(`# skipped cgroups: ${skip}`);

const state = (pid: number) => {
  try {
    return /^\d+ \(.*\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, "utf8"))?.[1];
  } catch {
    return undefined;
  }
};

describe("cgroups", { skip }, () => {
  let host: HostCgroups;
  before(async () => {
    host = await openHostCgroups(`cgroups-test-${process.pid}`, { cpus: 1, memoryBytes: 256 * 2 ** 20 });
  });
  after(() => host?.remove());

  it("cgroups - kill waits until the group's zombie is reaped, not only until cgroup.procs is empty", async () => {
    const group = await host.create("zombie", { cpus: 0.5, memoryBytes: 64 * 2 ** 20, pids: 8 });
    try {
      // A shell outside the group starts a child that joins the group and exits; the shell
      // reaps it only once a line arrives on its stdin (dash reaps at `wait`, not on SIGCHLD).
      const join = group.procsFiles.map((file) => `echo $$ > ${file}`).join("; ");
      const parent = spawn("sh", ["-c", `sh -c '${join}; exit 0' & echo $!; read line; wait`], {
        stdio: ["pipe", "pipe", "inherit"],
      });
      const exited = once(parent, "exit");
      const [line] = (await once(parent.stdout, "data")) as [Buffer];
      const child = Number(line.toString().trim());
      assert.ok(child > 0, `the child's pid: ${line}`);
      assert.ok(await pollUntil(() => state(child) === "Z", 10_000), `child ${child} became a zombie`);
      assert.deepEqual(group.pids(), [], "a zombie is not listed in cgroup.procs");
      assert.equal(group.tasks(), 1, "but it is still charged to the group");

      const killed = group.kill(30_000);
      // It cannot resolve while the zombie is there, however slow the machine.
      assert.equal(await within(killed, 200), false, "kill resolved while a task of the group was unreaped");
      assert.equal(state(child), "Z");
      parent.stdin.end("\n");
      await exited;
      await killed;
      assert.equal(existsSync(`/proc/${child}`), false, "the zombie was reaped before kill resolved");
      assert.equal(group.tasks(), 0);
    } finally {
      await group.remove();
    }
  });

  it("cgroups - kill of a group whose zombie is never reaped fails by its deadline", async () => {
    const group = await host.create("unreaped", { cpus: 0.5, memoryBytes: 64 * 2 ** 20, pids: 8 });
    const join = group.procsFiles.map((file) => `echo $$ > ${file}`).join("; ");
    const parent = spawn("sh", ["-c", `sh -c '${join}; exit 0' & echo $!; read line; wait`], {
      stdio: ["pipe", "pipe", "inherit"],
    });
    const exited = once(parent, "exit");
    try {
      const [line] = (await once(parent.stdout, "data")) as [Buffer];
      const child = Number(line.toString().trim());
      assert.ok(await pollUntil(() => state(child) === "Z", 10_000), `child ${child} became a zombie`);
      await assert.rejects(group.kill(300), /still has 1 tasks ending/);
    } finally {
      parent.stdin.end("\n");
      await exited;
      await group.remove();
    }
  });
});

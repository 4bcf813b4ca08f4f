// Process helpers of the isolated providers' launchers: a command started inside its cgroup
// from its first instruction on, and a signal to a pid that may be gone.
import { spawn, type ChildProcess } from "node:child_process";
import type { InstanceCgroup } from "./cgroups.ts";

/**
 * Starts `command` inside `cgroup`: a shell writes its own pid to each group's `cgroup.procs`,
 * then becomes the command (same pid), so nothing of the instance ever runs outside its group.
 * It dies with the host from its first instruction on: setpriv asks for SIGKILL when its parent
 * dies, and the shell ends at once if the host died before that (its parent is no longer the
 * host), so a wall being started when the host is killed is not left behind (the wall's own
 * --die-with-parent or --pdeathsig comes only once the command runs).
 * `extraFds` become fds 3, 4, … of the command (a pipe where `"pipe"`).
 */
export function spawnInCgroup(
  cgroup: InstanceCgroup,
  command: readonly string[],
  extraFds: readonly (number | "pipe")[] = [],
): ChildProcess {
  const script =
    '[ "$PPID" = "$1" ] || exit 98; shift; ' +
    'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"';
  const shell = ["/bin/sh", "-c", script, "microvm-sandbox", String(process.pid), ...cgroup.procsFiles];
  const child = spawn("setpriv", ["--pdeathsig", "KILL", "--", ...shell, "--", ...command], {
    stdio: ["pipe", "pipe", "pipe", ...extraFds],
    env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
  });
  child.stdin?.on("error", () => undefined);
  child.on("error", () => undefined);
  return child;
}

/** Sends a signal to a pid that may be gone already. */
export function sendSignal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone already.
  }
}

// Whether this machine can run the sandbox provider: bubblewrap present, user and network
// namespaces allowed for the sandbox's uid, and a cgroup hierarchy we may write. One trial
// sandbox runs `node -e 0` with an instance's flags; the answer names what is missing and how to get it.
import { execFile } from "node:child_process";
import { mkdir, rmdir } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { cgroupVersion } from "./cgroups.ts";
import { DEFAULT_UID_BASE } from "./instance-uids.ts";
import { trialNodeFlags } from "./node-args.ts";
import { sharedLibraries } from "./sandbox-command.ts";

const run = promisify(execFile);

export type SandboxCheck =
  | { readonly ok: true; readonly cgroupVersion: 1 | 2 }
  | { readonly ok: false; readonly reason: string };

export async function checkSandbox(options: { bwrap?: string; hostUid?: number } = {}): Promise<SandboxCheck> {
  const bwrap = options.bwrap ?? "bwrap";
  try {
    await run(bwrap, ["--version"]);
  } catch {
    return { ok: false, reason: "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)" };
  }
  const version = cgroupVersion();
  if (version === undefined)
    return { ok: false, reason: "no cgroup hierarchy with the memory, cpu, pids and freezer controllers" };
  const probe = join("/sys/fs/cgroup", version === 2 ? "" : "memory", `typed-service-check-${process.pid}`);
  try {
    await mkdir(probe);
    await rmdir(probe);
  } catch {
    return {
      ok: false,
      reason: "cannot create cgroups (run the microVM host as root, or delegate a cgroup subtree to it)",
    };
  }
  const asRoot = process.getuid?.() === 0;
  const uid = String(options.hostUid ?? DEFAULT_UID_BASE);
  const drop = asRoot ? ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "--"] : [];
  const binds = sharedLibraries(process.execPath).flatMap(([inside, host]) => ["--ro-bind", host, inside]);
  const trial = [
    bwrap,
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    process.execPath,
    process.execPath,
    ...binds,
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--",
    process.execPath,
    // An instance's node flags: one this node refuses fails here, not in every instance.
    ...trialNodeFlags(),
    "-e",
    "0",
  ];
  const [command, ...args] = [...drop, ...trial] as [string, ...string[]];
  try {
    await run(command, args, { timeout: 10_000 });
  } catch (error) {
    const detail =
      String((error as { stderr?: string }).stderr ?? "")
        .trim()
        .split("\n")[0] ?? "";
    // node refusing a flag is no namespace matter.
    const hint = /bad option/.test(detail) ? "" : " (user namespaces may be disabled)";
    return { ok: false, reason: `a trial sandbox failed${detail ? `: ${detail}` : ""}${hint}` };
  }
  return { ok: true, cgroupVersion: version };
}

// The sandbox provider: each instance in a bubblewrap sandbox (own user, PID, mount, IPC, UTS,
// cgroup and network namespaces; read-only node and bundle; bounded tmpfs scratch) as a host uid
// of its own, inside its cgroup (isolated-provider.ts has what it shares with gVisor).
import type { ChildProcess } from "node:child_process";
import { constants } from "node:fs";
import { open, readFile } from "node:fs/promises";
import { isAbsolute } from "node:path";
import type { Readable, Writable } from "node:stream";
import {
  createIsolatedProvider,
  type IsolatedProvider,
  type IsolatedProviderOptions,
  type Launcher,
} from "./isolated-provider.ts";
import { sendSignal, spawnInCgroup } from "./isolated-spawn.ts";
import { hostNode, type InstanceNode } from "./node-args.ts";
import { readProcStat } from "./proc.ts";
import { instanceMeminfo, sandboxArgs, sharedLibraries } from "./sandbox-command.ts";

export interface SandboxProviderOptions extends IsolatedProviderOptions {
  /** The bubblewrap binary (default `bwrap` on PATH). */
  readonly bwrap?: string;
}

export type SandboxProvider = IsolatedProvider;

const INFO_FD = 3;
const BUNDLE_FD = 4;
const SOCKET_DIR_FD = 5;
const MEMINFO_FD = 6;

export async function createSandboxProvider(options: SandboxProviderOptions): Promise<SandboxProvider> {
  return createIsolatedProvider(options, bwrapLauncher(options.bwrap ?? "bwrap", options.node ?? hostNode()));
}

function bwrapLauncher(bwrap: string, node: InstanceNode): Launcher {
  const libraries = sharedLibraries(node.path);
  return {
    name: "sandbox",
    overheadMiB: 0,
    overheadPids: 0,
    needs: [...(isAbsolute(bwrap) ? [bwrap] : []), node.path, ...libraries.map(([, host]) => host)],
    async launch(instance) {
      // The files reach the sandbox as fds: no path of the host's work directory is opened by the instance's uid.
      const opened = await Promise.allSettled([
        open(instance.runtimeFile, "r"),
        open(instance.socketDir, constants.O_RDONLY | constants.O_DIRECTORY),
      ]);
      const fds = opened.flatMap((result) => (result.status === "fulfilled" ? [result.value] : []));
      const failed = opened.find((result) => result.status === "rejected");
      if (failed) {
        await Promise.all(fds.map((handle) => handle.close()));
        throw failed.reason;
      }
      const meminfo = instanceMeminfo(instance.cgroup.limits().memoryBytes, await readFile("/proc/meminfo", "utf8"));
      const drop =
        instance.uid === undefined
          ? []
          : ["setpriv", `--reuid=${instance.uid}`, `--regid=${instance.uid}`, "--clear-groups", "--"];
      let child: ChildProcess;
      try {
        child = spawnInCgroup(
          instance.cgroup,
          [
            ...drop,
            bwrap,
            ...sandboxArgs({
              bwrap,
              node,
              libraries,
              bundleFd: BUNDLE_FD,
              socketDirFd: SOCKET_DIR_FD,
              scratchBytes: instance.scratchBytes,
              heapMiB: instance.heapMiB,
              cpus: instance.cpus,
              permissions: instance.permissions,
              infoFd: INFO_FD,
              meminfoFd: MEMINFO_FD,
            }),
          ],
          ["pipe", ...fds.map((handle) => handle.fd), "pipe"],
        );
        // bwrap reads it whole before the sandbox starts.
        (child.stdio as unknown as (Writable | null)[])[MEMINFO_FD]?.on("error", () => undefined).end(meminfo);
      } finally {
        await Promise.all(fds.map((handle) => handle.close()));
      }
      /** Pid (host namespace) of the sandbox's init. */
      let initPid: number | undefined;
      return {
        child,
        async ready(deadline, signal, stderrTail) {
          initPid = await sandboxPidOf(child, deadline, signal, stderrTail);
        },
        pid: () => initPid,
        async stop() {
          // SIGTERM to the runtime only: the sandbox's init ignores it, and its death would SIGKILL all.
          for (const pid of instance.cgroup.pids()) {
            if (pid > 1 && initPid !== undefined && readProcStat(pid)?.ppid === initPid) sendSignal(pid, "SIGTERM");
          }
        },
        async kill() {
          // SIGKILL to the init ends its whole PID namespace and lets bwrap reap it.
          if (initPid !== undefined && initPid > 1) sendSignal(initPid, "SIGKILL");
          else child.kill("SIGKILL");
        },
      };
    },
  };
}

/** Reads bwrap's info JSON (`{"child-pid": N}`) from its info fd: a channel image code cannot write. */
function sandboxPidOf(
  child: ChildProcess,
  deadline: number,
  signal: AbortSignal | undefined,
  stderrTail: readonly string[],
): Promise<number> {
  const info = child.stdio[INFO_FD] as Readable | null;
  return new Promise((resolve, reject) => {
    let text = "";
    const timer = setTimeout(
      () => finish(new Error("timed out waiting for the sandbox to start")),
      Math.max(0, deadline - Date.now()),
    );
    const onData = (chunk: Buffer) => {
      text += chunk.toString();
      if (text.length > 4096) return finish(new Error("unexpected sandbox info"));
      const pid = /"child-pid"\s*:\s*(\d+)/.exec(text)?.[1];
      if (pid !== undefined) finish(undefined, Number(pid));
    };
    const onExit = (code: number | null, sig: NodeJS.Signals | null) => {
      const tail = stderrTail.join("\n");
      finish(new Error(`sandbox exited (${sig ?? `code ${code}`}) before it started${tail ? `:\n${tail}` : ""}`));
    };
    const onAbort = () => finish(new Error("start aborted"));
    function finish(error: Error | undefined, pid?: number) {
      clearTimeout(timer);
      info?.off("data", onData);
      child.off("exit", onExit);
      signal?.removeEventListener("abort", onAbort);
      if (error) reject(error);
      else resolve(pid as number);
    }
    if (!info) return finish(new Error("no info pipe"));
    if (signal?.aborted) return onAbort();
    // Ended already (bwrap missing: its shell exits at once), before "exit" could be heard here.
    if (child.exitCode !== null || child.signalCode !== null) return onExit(child.exitCode, child.signalCode);
    info.on("data", onData);
    info.on("error", () => undefined);
    child.once("exit", onExit);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

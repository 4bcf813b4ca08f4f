// The command line of a sandboxed instance: bubblewrap with new user, PID, mount, IPC, UTS,
// cgroup and network namespaces; a read-only view of node, its libraries and the image
// bundle; a size-bounded tmpfs scratch; the runtime's unix socket in a directory the host made,
// bound in by file descriptor at /run/microvm.
import { execFileSync } from "node:child_process";
import { existsSync, realpathSync } from "node:fs";
import { runtimeNodeArgs, type InstanceNode } from "./node-args.ts";
import { RUNTIME_SOCKET_NAME } from "./runtime-socket.ts";
import { CPUS_ENV } from "../runtime/cpu-count.ts";

/** Paths inside the instance. */
export const SANDBOX_PATHS = {
  bundle: "/app/image.mjs",
  scratch: "/scratch",
  socketDir: "/run/microvm",
  socket: `/run/microvm/${RUNTIME_SOCKET_NAME}`,
} as const;

/** Every sandboxed instance's command line (bwrap's) contains this. */
export const SANDBOX_MARKER = SANDBOX_PATHS.bundle;

/** The uid and gid image code runs as inside its user namespace. */
export const SANDBOX_UID = 1000;

export interface SandboxLaunch {
  readonly bwrap: string;
  /** The node binary (bound read-only at the same path) and its version. */
  readonly node: InstanceNode;
  /** Shared libraries node needs: [path inside, real path on the host]. */
  readonly libraries: readonly (readonly [string, string])[];
  /**
   * File descriptor of the image bundle, copied into the sandbox read-only (the host's work
   * directory stays closed to the sandbox's uid).
   */
  readonly bundleFd: number;
  readonly scratchBytes: number;
  /** V8 heap cap in MiB. */
  readonly heapMiB: number;
  /** The CPUs the instance counts (`MICROVM_CPUS`: its quota rounded up). */
  readonly cpus: number;
  /** Node's permission model inside as a second wall (default true). */
  readonly permissions: boolean;
  /** File descriptor bwrap reports the sandbox's pid on. */
  readonly infoFd: number;
  /** File descriptor of the host directory bound at /run/microvm (the runtime's socket goes there). */
  readonly socketDirFd: number;
  /** File descriptor of the instance's /proc/meminfo (`instanceMeminfo`), bound over procfs'. */
  readonly meminfoFd?: number;
}

/** argv (after the executable) of `bwrap … node … bundle`. */
export function sandboxArgs(launch: SandboxLaunch): string[] {
  const binds = [
    ...roBind(launch.node.path, launch.node.path),
    ...launch.libraries.flatMap(([inside, host]) => roBind(host, inside)),
    ...(existsSync("/etc/ld.so.cache") ? roBind("/etc/ld.so.cache", "/etc/ld.so.cache") : []),
    "--perms",
    "0444",
    "--ro-bind-data",
    String(launch.bundleFd),
    SANDBOX_PATHS.bundle,
  ];
  const env = instanceEnv(launch.cpus);
  const nodeArgs = instanceNodeArgs(launch.heapMiB, launch.permissions, launch.node.version);
  return [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup",
    "--unshare-net",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--uid",
    String(SANDBOX_UID),
    "--gid",
    String(SANDBOX_UID),
    "--hostname",
    "microvm",
    "--clearenv",
    ...Object.entries(env).flatMap(([name, value]) => ["--setenv", name, value]),
    ...binds,
    "--proc",
    "/proc",
    ...(launch.meminfoFd === undefined ? [] : ["--ro-bind-data", String(launch.meminfoFd), "/proc/meminfo"]),
    "--dev",
    "/dev",
    "--size",
    String(launch.scratchBytes),
    "--tmpfs",
    SANDBOX_PATHS.scratch,
    "--size",
    String(64 * 1024),
    "--tmpfs",
    "/run",
    "--bind-fd",
    String(launch.socketDirFd),
    SANDBOX_PATHS.socketDir,
    "--remount-ro",
    "/",
    "--chdir",
    SANDBOX_PATHS.scratch,
    "--info-fd",
    String(launch.infoFd),
    "--",
    launch.node.path,
    ...nodeArgs,
  ];
}

/**
 * The whole environment of an instance's runtime (nothing of the host's). The wall starts
 * before its image: the runtime sets MICROVM_ID and writes the module it is sent on stdin.
 * `cpus`: the CPUs the runtime reports to the image (its quota rounded up).
 */
export function instanceEnv(cpus: number): Record<string, string> {
  return {
    PATH: "/usr/bin:/bin",
    HOME: SANDBOX_PATHS.scratch,
    TMPDIR: SANDBOX_PATHS.scratch,
    LANG: "C.UTF-8",
    NODE_ENV: "production",
    MICROVM_RUNTIME_SOCKET: SANDBOX_PATHS.socket,
    [CPUS_ENV]: String(cpus),
  };
}

/** node's arguments inside an instance: its files at the paths inside, scratch the only writable one. */
export function instanceNodeArgs(heapMiB: number, permissions: boolean, nodeVersion: string): string[] {
  return runtimeNodeArgs({
    nodeVersion,
    heapMiB,
    permissions,
    readable: [SANDBOX_PATHS.bundle, SANDBOX_PATHS.scratch],
    writable: [SANDBOX_PATHS.scratch],
    entry: SANDBOX_PATHS.bundle,
  });
}

/**
 * The host's /proc/meminfo as an instance with a memory cap of `memoryBytes` sees it: its
 * total, free and available memory are the cap (node's os.totalmem() and os.freemem() read
 * them), the rest the host's as it was at the start.
 */
export function instanceMeminfo(memoryBytes: number, hostMeminfo: string): string {
  const kB = Math.floor(memoryBytes / 1024);
  return hostMeminfo.replace(
    /^(MemTotal|MemFree|MemAvailable):\s*\d+ kB$/gm,
    (_line, name: string) => `${`${name}:`.padEnd(16)}${String(kB).padStart(8)} kB`,
  );
}

function roBind(host: string, inside: string): string[] {
  return ["--ro-bind", host, inside];
}

/**
 * The shared libraries of `binary` as `ldd` lists them, each with its real path on the host.
 * Empty for a static binary; throws when ldd cannot tell.
 */
export function sharedLibraries(binary: string): [string, string][] {
  const output = execFileSync("ldd", [binary], { encoding: "utf8" });
  const libraries: [string, string][] = [];
  for (const line of output.split("\n")) {
    const path = /=>\s+(\/\S+)/.exec(line)?.[1] ?? /^\s*(\/\S+)\s+\(/.exec(line)?.[1];
    if (path) libraries.push([path, realpathSync(path)]);
  }
  return libraries;
}

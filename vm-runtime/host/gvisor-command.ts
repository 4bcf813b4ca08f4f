// The OCI bundle and command line of a gVisor instance: `runsc run` with no network, a
// read-only root holding only node, its libraries and the image files, a size-bounded tmpfs
// scratch, and the host directory of the runtime's socket (`--host-uds=create` lets the runtime
// bind a real host socket there); no capabilities, no new privileges, its own host uid.
// A restore writes the same bundle (runsc checks it against the checkpoint) and restores into it.
import { chmodSync, copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import type { InstanceNode } from "./node-args.ts";
import { instanceEnv, instanceNodeArgs, SANDBOX_PATHS } from "./sandbox-command.ts";
import { LAUNCH_OPENSSL_CONFIG } from "../runtime/fresh-entropy.ts";

/** Where a template's OpenSSL configuration is in its read-only root. */
const LAUNCH_OPENSSL_CONFIG_PATH = "/app/openssl-rdrand.cnf";

export interface GvisorLaunch {
  readonly runsc: string;
  /** runsc's state directory for this instance (`--root`). */
  readonly stateDir: string;
  /** Directory for config.json and the (empty, read-only) root. */
  readonly bundleDir: string;
  readonly containerId: string;
  /** The node binary (bound read-only at the same path) and its version. */
  readonly node: InstanceNode;
  /** Shared libraries node needs: [path inside, real path on the host]. */
  readonly libraries: readonly (readonly [string, string])[];
  readonly runtimeFile: string;
  readonly socketDir: string;
  readonly uid: number;
  readonly scratchBytes: number;
  readonly heapMiB: number;
  /** The CPUs the instance counts (`MICROVM_CPUS`: its quota rounded up). */
  readonly cpus: number;
  /** Processes and threads of the instance's user (RLIMIT_NPROC inside). */
  readonly pids: number;
  readonly permissions: boolean;
  /** A launch snapshot's template (or a restore of one): node's RAND is the CPU's RDRAND. */
  readonly launchTemplate?: boolean;
  /** The command to run instead of the runtime (the availability check). */
  readonly args?: readonly string[];
  /** A checkpoint image directory: `runsc restore` from it instead of `runsc run`. */
  readonly restoreFrom?: string;
  /**
   * The instance's cgroup (`InstanceCgroup.path`), made and limited by the host: runsc reads
   * its memory cap and CPUs from it and tells the Sentry, so the instance's /proc/meminfo,
   * CPU count and affinity show its limits. Without it runsc leaves cgroups alone.
   */
  readonly cgroupsPath?: string;
}

/**
 * runsc's global flags: no network, host sockets created in bound directories only. Cgroups
 * are the host's: runsc reads an instance's (`GvisorLaunch.cgroupsPath`) and makes none, or
 * with `ignoreCgroups` (commands other than run and restore, the trial) is told to leave them be.
 */
export function runscFlags(stateDir: string, ignoreCgroups = true): string[] {
  return [
    `--root=${stateDir}`,
    "--network=none",
    "--host-uds=create",
    ...(ignoreCgroups ? ["--ignore-cgroups"] : []),
    "--overlay2=none",
    "--platform=systrap",
  ];
}

/** Writes the bundle (config.json and the mount points of its read-only root); returns runsc's argv. */
export function prepareGvisorBundle(launch: GvisorLaunch): string[] {
  const rootfs = join(launch.bundleDir, "rootfs");
  const files = [
    [launch.node.path, launch.node.path],
    ...launch.libraries.map(([inside, host]) => [host, inside] as const),
    ["/etc/ld.so.cache", "/etc/ld.so.cache"],
  ] as const;
  // Mount points exist in the root beforehand: it is read-only, and nothing else is in it.
  for (const [, inside] of files) {
    mkdirSync(join(rootfs, dirname(inside)), { recursive: true });
    writeFileSync(join(rootfs, inside), "");
  }
  // The runtime bundle is a copy in the root, readable by the instance's uid whatever the
  // original's mode (the host's work directory is closed to instance uids).
  mkdirSync(join(rootfs, dirname(SANDBOX_PATHS.bundle)), { recursive: true });
  copyFileSync(launch.runtimeFile, join(rootfs, SANDBOX_PATHS.bundle));
  chmodSync(join(rootfs, SANDBOX_PATHS.bundle), 0o444);
  for (const dir of ["proc", "dev", "tmp", SANDBOX_PATHS.scratch, SANDBOX_PATHS.socketDir]) {
    mkdirSync(join(rootfs, dir), { recursive: true });
  }
  const readOnly = (host: string, inside: string) => ({
    destination: inside,
    type: "bind",
    source: host,
    options: ["rbind", "ro", "nosuid", "nodev"],
  });
  if (launch.launchTemplate)
    writeFileSync(join(rootfs, LAUNCH_OPENSSL_CONFIG_PATH), LAUNCH_OPENSSL_CONFIG, { mode: 0o444 });
  const env = instanceEnv(launch.cpus);
  const args = launch.args ?? [
    launch.node.path,
    ...(launch.launchTemplate ? [`--openssl-config=${LAUNCH_OPENSSL_CONFIG_PATH}`] : []),
    ...instanceNodeArgs(launch.heapMiB, launch.permissions, launch.node.version),
  ];
  const config = {
    ociVersion: "1.0.0",
    process: {
      user: { uid: launch.uid, gid: launch.uid },
      args,
      env: Object.entries(env).map(([name, value]) => `${name}=${value}`),
      cwd: SANDBOX_PATHS.scratch,
      capabilities: { bounding: [], effective: [], inheritable: [], permitted: [] },
      rlimits: [
        { type: "RLIMIT_NOFILE", hard: 1024, soft: 1024 },
        { type: "RLIMIT_NPROC", hard: launch.pids, soft: launch.pids },
      ],
      noNewPrivileges: true,
    },
    root: { path: rootfs, readonly: true },
    hostname: "microvm",
    mounts: [
      { destination: "/proc", type: "proc", source: "proc" },
      { destination: "/dev", type: "tmpfs", source: "tmpfs", options: ["nosuid", "noexec", "mode=755"] },
      {
        destination: SANDBOX_PATHS.scratch,
        type: "tmpfs",
        source: "tmpfs",
        options: ["nosuid", "nodev", `size=${launch.scratchBytes}`, "mode=1777"],
      },
      { destination: "/tmp", type: "tmpfs", source: "tmpfs", options: ["nosuid", "nodev", "size=1m", "mode=1777"] },
      ...files.map(([host, inside]) => readOnly(host, inside)),
      {
        destination: SANDBOX_PATHS.socketDir,
        type: "bind",
        source: launch.socketDir,
        options: ["rbind", "rw", "nosuid", "nodev", "noexec"],
      },
    ],
    linux: {
      namespaces: [{ type: "pid" }, { type: "network" }, { type: "ipc" }, { type: "uts" }, { type: "mount" }],
      // Every hierarchy's directory exists (cgroups.ts): runsc joins them, writes no limit, removes none.
      ...(launch.cgroupsPath === undefined ? {} : { cgroupsPath: launch.cgroupsPath }),
    },
  };
  writeFileSync(join(launch.bundleDir, "config.json"), JSON.stringify(config));
  const command = launch.restoreFrom === undefined ? ["run"] : ["restore", `--image-path=${launch.restoreFrom}`];
  return [
    ...runscFlags(launch.stateDir, launch.cgroupsPath === undefined),
    ...command,
    `--bundle=${launch.bundleDir}`,
    launch.containerId,
  ];
}

// The node command line of an instance's runtime, shared by every provider: heap cap, a small
// young generation, no V8 helper threads, and Node's permission model (a third layer inside
// the sandbox, not a wall) limited to the instance's own files. Flags follow the node version.

/** The node binary instances run, and its version (which decides its flags). */
export interface InstanceNode {
  readonly path: string;
  /** As `process.versions.node` says it: `24.11.1`. */
  readonly version: string;
}

/** The host's own node: what instances run unless a provider is given another. */
export function hostNode(): InstanceNode {
  return { path: process.execPath, version: process.versions.node };
}

/** Node's permission flag: `--permission` from 22.13/23.5 on (24 refuses the old name). */
export function permissionFlag(version = process.versions.node): string {
  const [major = 0, minor = 0] = version.split(".").map(Number);
  return major > 23 || (major === 23 && minor >= 5) || (major === 22 && minor >= 13)
    ? "--permission"
    : "--experimental-permission";
}

/**
 * Node's permission flags beyond the file system that an instance's runtime needs: from 25 on
 * the model gates sockets too, and the runtime listens on one (TCP or a Unix socket; 24 and
 * older refuse the flag). The network itself is the wall's to deny (no interface in the sandbox).
 */
export function permissionGrants(version = process.versions.node): string[] {
  const [major = 0] = version.split(".").map(Number);
  return major >= 25 ? ["--allow-net"] : [];
}

export interface RuntimeNodeFlags {
  /** The version of the node that runs them (default: the host's). */
  readonly nodeVersion?: string;
  readonly heapMiB: number;
  /** Node's permission model on (reads of `readable`, writes of `writable` only). */
  readonly permissions: boolean;
  readonly readable: readonly string[];
  readonly writable: readonly string[];
}

export interface RuntimeNodeArgs extends RuntimeNodeFlags {
  /** The runtime bundle to run. */
  readonly entry: string;
}

/** node's options for an instance's runtime (what a trial sandbox runs `-e 0` under too). */
export function runtimeNodeFlags({
  nodeVersion,
  heapMiB,
  permissions,
  readable,
  writable,
}: RuntimeNodeFlags): string[] {
  return [
    "--no-warnings",
    `--max-old-space-size=${heapMiB}`,
    // Measured: 1-4 MiB less per instance at no cost to RPC latency (a small young generation,
    // no V8 helper threads). --jitless/--lite-mode would break fetch in images on Node 20.
    "--max-semi-space-size=1",
    "--single-threaded",
    ...(permissions
      ? [
          permissionFlag(nodeVersion),
          ...permissionGrants(nodeVersion),
          ...readable.map((path) => `--allow-fs-read=${path}`),
          ...writable.map((path) => `--allow-fs-write=${path}`),
        ]
      : []),
  ];
}

/** The flags a trial sandbox runs the host's node under (`node <flags> -e 0`): an instance's. */
export function trialNodeFlags(): string[] {
  return runtimeNodeFlags({ heapMiB: 64, permissions: true, readable: [], writable: [] });
}

/** node's arguments (after the binary) for an instance's runtime. */
export function runtimeNodeArgs(args: RuntimeNodeArgs): string[] {
  return [...runtimeNodeFlags(args), args.entry];
}

// The node command line of an instance's runtime, shared by every provider: heap cap, a small
// young generation, no V8 helper threads, and Node's permission model (a third layer inside
// the sandbox, not a wall) limited to the instance's own files.

/** Node's permission flag: `--permission` from 22.13/23.5 on (24 refuses the old name). */
export function permissionFlag(version = process.versions.node): string {
  const [major = 0, minor = 0] = version.split(".").map(Number);
  return major > 23 || (major === 23 && minor >= 5) || (major === 22 && minor >= 13)
    ? "--permission"
    : "--experimental-permission";
}

export interface RuntimeNodeArgs {
  readonly heapMiB: number;
  /** Node's permission model on (reads of `readable`, writes of `writable` only). */
  readonly permissions: boolean;
  readonly readable: readonly string[];
  readonly writable: readonly string[];
  /** The runtime bundle to run. */
  readonly entry: string;
}

/** node's arguments (after the binary) for an instance's runtime. */
export function runtimeNodeArgs({ heapMiB, permissions, readable, writable, entry }: RuntimeNodeArgs): string[] {
  return [
    "--no-warnings",
    `--max-old-space-size=${heapMiB}`,
    // Measured: 1-4 MiB less per instance at no cost to RPC latency (a small young generation,
    // no V8 helper threads). --jitless/--lite-mode would break fetch in images on Node 20.
    "--max-semi-space-size=1",
    "--single-threaded",
    ...(permissions
      ? [
          permissionFlag(),
          ...readable.map((path) => `--allow-fs-read=${path}`),
          ...writable.map((path) => `--allow-fs-write=${path}`),
        ]
      : []),
    entry,
  ];
}

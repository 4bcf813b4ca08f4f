// The isolating providers this machine has, for suites that run once per provider: the
// bubblewrap sandbox always (CI installs it), gVisor where runsc runs. With REQUIRE_GVISOR=1
// (.ci/run sets it) a machine without a working runsc fails instead of skipping gVisor.
import assert from "node:assert/strict";
import {
  checkGvisor,
  createGvisorProvider,
  createSandboxProvider,
  type IsolatedProvider,
  type IsolatedProviderOptions,
} from "../../vm-runtime/service/index.ts";

export type IsolatedProviderName = "sandbox" | "gvisor";

export interface ProviderKind {
  readonly name: IsolatedProviderName;
  /** What the wall itself costs per instance beyond node's (the cgroup's memory cap includes it). */
  readonly overheadMiB: number;
  /** Host threads of the wall itself (the cgroup's pids limit includes them). */
  readonly overheadPids: number;
  create(options: IsolatedProviderOptions): Promise<IsolatedProvider>;
}

const sandbox: ProviderKind = { name: "sandbox", overheadMiB: 0, overheadPids: 0, create: createSandboxProvider };
const gvisor: ProviderKind = { name: "gvisor", overheadMiB: 64, overheadPids: 96, create: createGvisorProvider };

/** The providers to test here; prints why gVisor is left out where it is. */
export async function isolatedProviders(): Promise<ProviderKind[]> {
  const skip = await gvisorSkip();
  if (skip === false) return [sandbox, gvisor];
  console.log(`# gVisor provider not tested: ${skip}`);
  return [sandbox];
}

/**
 * A gVisor-only suite's `skip` option: false where runsc runs, else why not. With
 * REQUIRE_GVISOR=1 a machine without a working runsc fails the file instead.
 */
export async function gvisorSkip(): Promise<string | false> {
  const check = await checkGvisor();
  if (check.ok) return false;
  assert.notEqual(process.env.REQUIRE_GVISOR, "1", `gVisor cannot run here (${check.reason}) and REQUIRE_GVISOR=1`);
  return check.reason;
}

/** The named provider kind (`ESCAPE_PROVIDER` and the like). */
export function providerKind(name: IsolatedProviderName): ProviderKind {
  return name === "gvisor" ? gvisor : sandbox;
}

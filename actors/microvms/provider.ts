// Which isolation this host's instances get: the sandbox (default; refuses to start where the
// machine cannot run it, saying what is missing) or, as an explicit development opt-in, the
// plain process provider, announced with a warning on every start.
import { createHash } from "node:crypto";
import {
  checkSandbox,
  createProcessProvider,
  createSandboxProvider,
  type OutputSink,
  type ProcessProvider,
  type SandboxProvider,
} from "../../vm-runtime/index.ts";
import { log } from "../../platform/index.ts";

export type ProviderName = "sandbox" | "process";

/** Per-instance limits of the sandbox (the process provider honours `memoryMiB` only). */
export interface InstanceLimits {
  /** V8 heap cap in MiB (`MICROVM_MEMORY_MIB`, default 256). */
  readonly memoryMiB?: number;
  /** CPU quota in cores (`MICROVM_CPUS`, default 0.5). */
  readonly cpus?: number;
  /** CPU quota of all instances of the host together (`MICROVM_TOTAL_CPUS`, default every core). */
  readonly totalCpus?: number;
  /** Processes and threads (`MICROVM_PIDS`, default 64). */
  readonly pids?: number;
  /** Scratch tmpfs size in MiB (`MICROVM_SCRATCH_MIB`, default 64). */
  readonly scratchMiB?: number;
}

/** The provider could not be made; `message` says what is missing and how to fix it. */
export class ProviderUnavailable extends Error {
  override readonly name = "ProviderUnavailable";
}

export async function createHostProvider(
  name: ProviderName,
  hostId: string,
  workDir: string,
  limits: InstanceLimits = {},
): Promise<SandboxProvider | ProcessProvider> {
  const onOutput: OutputSink = (microvmId, stream, line) => log.debug({ microvmId, stream, line }, "instance output");
  if (name === "process") {
    log.warn(
      "MICROVM_PROVIDER=process: instances run as plain processes of this host's user, NOT isolated " +
        "(they can reach the network and NATS, signal host processes and fill the disk). Development only.",
    );
    return createProcessProvider({
      workDir,
      onOutput,
      ...(limits.memoryMiB === undefined ? {} : { memoryMiB: limits.memoryMiB }),
    });
  }
  const check = await checkSandbox();
  if (!check.ok) {
    throw new ProviderUnavailable(
      `the microVM sandbox cannot run here: ${check.reason}; or set MICROVM_PROVIDER=process for unisolated development use`,
    );
  }
  const hostKey = createHash("sha256").update(hostId).digest("hex").slice(0, 16);
  const provider = await createSandboxProvider({ hostKey, workDir, onOutput, ...withoutUndefined(limits) });
  log.info(
    { cgroup: `v${provider.cgroupVersion}`, ...limits },
    "microVM isolation: sandbox (bubblewrap namespaces + cgroups)",
  );
  return provider;
}

function withoutUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

// Which isolation this host's instances get: gVisor where it runs, else the bubblewrap sandbox
// (each refuses to start where the machine cannot run it, saying what is missing), or, as an
// explicit development opt-in, the plain process provider, announced with a warning.
import { createHash } from "node:crypto";
import {
  checkGvisor,
  checkSandbox,
  createGvisorProvider,
  createProcessProvider,
  createSandboxProvider,
  type IsolatedProvider,
  type IsolatedProviderOptions,
  type OutputSink,
  type ProcessProvider,
} from "../../vm-runtime/index.ts";
import { log } from "../../platform/index.ts";

/** `auto` (the default): gvisor where it runs, else sandbox. */
export type ProviderName = "auto" | "gvisor" | "sandbox" | "process";

/**
 * Per-instance limits of the sandboxes and their host-wide caps (the process provider honours
 * `memoryMiB` only); main.ts reads them from MICROVM_MEMORY_MIB, MICROVM_CPUS,
 * MICROVM_TOTAL_CPUS, MICROVM_TOTAL_MEMORY_MIB, MICROVM_PIDS, MICROVM_SCRATCH_MIB, MICROVM_UID_BASE,
 * MICROVM_WARM_INSTANCES.
 */
export type InstanceLimits = Pick<
  IsolatedProviderOptions,
  "memoryMiB" | "cpus" | "totalCpus" | "totalMemoryMiB" | "pids" | "scratchMiB" | "uidBase" | "warmInstances"
>;

/** The provider could not be made; `message` says what is missing and how to fix it. */
export class ProviderUnavailable extends Error {
  override readonly name = "ProviderUnavailable";
}

export async function createHostProvider(
  name: ProviderName,
  hostId: string,
  workDir: string,
  limits: InstanceLimits = {},
): Promise<IsolatedProvider | ProcessProvider> {
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
  const hostKey = createHash("sha256").update(hostId).digest("hex").slice(0, 16);
  const options = { hostKey, workDir, onOutput, ...withoutUndefined(limits) };
  let gvisorSkipped: string | undefined;
  if (name === "gvisor" || name === "auto") {
    const check = await checkGvisor();
    if (check.ok) {
      const provider = await createGvisorProvider(options);
      log.info(
        { provider: "gvisor", cgroup: `v${provider.cgroupVersion}`, ...limits },
        "microVM isolation: gVisor (runsc user-space kernel, no network) + cgroups, a host uid per instance",
      );
      return provider;
    }
    if (name === "gvisor") throw new ProviderUnavailable(`MICROVM_PROVIDER=gvisor cannot run here: ${check.reason}`);
    gvisorSkipped = check.reason;
  }
  const check = await checkSandbox();
  if (!check.ok) {
    throw new ProviderUnavailable(
      `the microVM sandbox cannot run here: ${check.reason}${gvisorSkipped ? `; gVisor: ${gvisorSkipped}` : ""}; ` +
        "or set MICROVM_PROVIDER=process for unisolated development use",
    );
  }
  const provider = await createSandboxProvider(options);
  log.info(
    {
      provider: "sandbox",
      cgroup: `v${provider.cgroupVersion}`,
      ...limits,
      ...(gvisorSkipped ? { gvisorSkipped } : {}),
    },
    `microVM isolation: sandbox (bubblewrap namespaces + cgroups, a host uid per instance)${
      gvisorSkipped ? `; gVisor skipped: ${gvisorSkipped}` : ""
    }`,
  );
  return provider;
}

function withoutUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

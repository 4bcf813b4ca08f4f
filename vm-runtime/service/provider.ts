// Which isolation this host's instances get: gVisor where it runs, else the bubblewrap sandbox
// (each refuses to start where the machine cannot run it, saying what is missing), or, as an
// explicit development opt-in, the plain process provider, announced with a warning. An
// instance that does not start is logged here with its cause.
import { createHash } from "node:crypto";
import { resolve } from "node:path";
import { checkGvisor, createGvisorProvider } from "../host/gvisor-provider.ts";
import { checkSandbox } from "../host/sandbox-check.ts";
import { createProcessProvider, type ProcessProvider } from "../host/process-provider.ts";
import { createSandboxProvider } from "../host/sandbox-provider.ts";
import { exitText } from "../host/start-failure.ts";
import { hostFailureOf, startFailureOf, type MicrovmProvider } from "../host/provider.ts";
import type { IsolatedProvider, IsolatedProviderOptions } from "../host/isolated-provider.ts";
import type { OutputSink } from "../host/process-io.ts";
import { log } from "../../platform/index.ts";

/** `auto` (the default): gvisor where it runs, else sandbox. */
export type ProviderName = "auto" | "gvisor" | "sandbox" | "process";

/**
 * Per-instance limits of the sandboxes and their host-wide caps (the process provider honours
 * `memoryMiB` only); main.ts reads them from MICROVM_MEMORY_MIB, MICROVM_CPUS,
 * MICROVM_TOTAL_CPUS, MICROVM_TOTAL_MEMORY_MIB, MICROVM_PIDS, MICROVM_SCRATCH_MIB, MICROVM_UID_BASE,
 * MICROVM_WARM_INSTANCES, MICROVM_BOOT_SLOTS.
 */
export type InstanceLimits = Pick<
  IsolatedProviderOptions,
  | "memoryMiB"
  | "cpus"
  | "totalCpus"
  | "totalMemoryMiB"
  | "pids"
  | "scratchMiB"
  | "uidBase"
  | "warmInstances"
  | "bootSlots"
> & {
  /** Slow images start from a launch snapshot (gVisor; default on, `MICROVM_LAUNCH_SNAPSHOTS=0` off). */
  readonly launchSnapshots?: boolean;
};

/**
 * The name of a host's cgroups and run directory: from its work directory (data dir and host
 * id), so two services that share a host id but not a data dir (tests on private NATS servers)
 * never reclaim each other's instances, and a host started again finds what it left.
 */
export const hostCgroupKey = (workDir: string): string =>
  createHash("sha256").update(resolve(workDir)).digest("hex").slice(0, 16);

/** The provider could not be made; `message` says what is missing and how to fix it. */
export class ProviderUnavailable extends Error {
  override readonly name = "ProviderUnavailable";
}

export async function createHostProvider(
  name: ProviderName,
  workDir: string,
  limits: InstanceLimits = {},
  onOutput: OutputSink = (microvmId, stream, line) => log.debug({ microvmId, stream, line }, "instance output"),
): Promise<IsolatedProvider | ProcessProvider> {
  if (name === "process") {
    log.warn(
      "MICROVM_PROVIDER=process: instances run as plain processes of this host's user, NOT isolated " +
        "(they can reach the network and NATS, signal host processes and fill the disk). Development only.",
    );
    return loggingStartFailures(
      createProcessProvider({
        workDir,
        onOutput,
        ...(limits.memoryMiB === undefined ? {} : { memoryMiB: limits.memoryMiB }),
      }),
    );
  }
  const { launchSnapshots = true, ...sandboxLimits } = limits;
  const options: IsolatedProviderOptions = {
    hostKey: hostCgroupKey(workDir),
    workDir,
    onOutput,
    // Slow images start from a launch snapshot where restores are measured faster (gVisor).
    ...(launchSnapshots ? { launchSnapshots: {} } : {}),
    log: (message, err) => log.warn({ err }, message),
    ...withoutUndefined(sandboxLimits),
  };
  let gvisorSkipped: string | undefined;
  if (name === "gvisor" || name === "auto") {
    const check = await checkGvisor();
    if (check.ok) {
      const provider = await createGvisorProvider(options);
      log.info(
        { provider: "gvisor", cgroup: `v${provider.cgroupVersion}`, ...limits },
        "microVM isolation: gVisor (runsc user-space kernel, no network) + cgroups, a host uid per instance",
      );
      return loggingStartFailures(provider);
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
  return loggingStartFailures(provider);
}

/**
 * `provider` whose failed starts are logged with their cause: those of the host (its wall or
 * node never came up: a flag node refuses, a binary gone) at error level with what the wall
 * printed, where the caller answers a bare 5xx or a `stateReason` that names no host detail;
 * the others (the runtime or the image ended or stalled once up) at warn level with how the
 * instance ended and its last stderr lines. A start its caller gave up (a terminate while
 * PENDING) is no failure.
 */
function loggingStartFailures<P extends MicrovmProvider>(provider: P): P {
  const start: MicrovmProvider["start"] = (spec, signal) =>
    provider.start(spec, signal).catch((err: unknown) => {
      const gaveUp = signal?.aborted === true && (signal.reason as Error | undefined)?.name !== "TimeoutError";
      if (!gaveUp) logStartFailure(spec.microvmId, provider.name, err);
      throw err;
    });
  return { ...provider, start };
}

function logStartFailure(microvmId: string, provider: string, err: unknown): void {
  const host = hostFailureOf(err);
  if (host) {
    const fields = { microvmId, provider, err, stderr: host.stderr };
    if (host.timedOut) log.warn(fields, "microVM instance did not start in time: this host is slow, not its image");
    else log.error(fields, "microVM instance did not start for a reason of this host, not of its image");
    return;
  }
  const failure = startFailureOf(err);
  if (!failure) return;
  log.warn(
    {
      microvmId,
      provider,
      reason: failure.message,
      ...(failure.exit ? { exit: exitText(failure.exit) } : {}),
      stderr: failure.stderr,
    },
    "microVM instance did not start: its runtime ended or did not answer once up",
  );
}

function withoutUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

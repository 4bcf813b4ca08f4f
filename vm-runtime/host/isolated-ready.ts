// A wall becoming its instance: named after it (its cgroup too), then waited for until its
// runtime's socket appears and answers the readiness probe, or failed as soon as it exits.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import type { HostCgroups } from "./cgroups.ts";
import { noteMembers, type Tracked } from "./isolated-walls.ts";
import { waitForHealth, withinImageShare } from "./process-io.ts";
import { safeName } from "./provider-util.ts";
import type { MicrovmHandle } from "./provider.ts";
import { openRuntimeSocket, type RuntimeSocket } from "./runtime-socket.ts";
import { INSTANCE_SECRET_HEADER } from "../wire/rpc.ts";

/** `assign` and `answering` of a provider named `provider` whose walls' groups are in `cgroups`. */
export function wallReadiness(cgroups: HostCgroups, provider: string) {
  /** Names a wall after the instance it now serves (its cgroup too). */
  async function assign(entry: Tracked, microvmId: string): Promise<void> {
    entry.microvmId = microvmId;
    // A wall that ended keeps its name: its group is being removed under it.
    if (entry.done) return;
    const renaming = cgroups.rename(entry.cgroup, `${safeName(microvmId)}-${randomBytes(4).toString("hex")}`);
    entry.renaming = renaming;
    entry.cgroup = await renaming;
  }

  /**
   * Waits (after `before`, if given) for the runtime's socket and its answer to the readiness
   * probe, or for the instance to exit first; resolves with its handle. With `imageTimeoutMs`
   * the image has that long from its runtime's boot line (`MicrovmSpec.imageTimeoutMs`).
   */
  async function answering(
    entry: Tracked,
    microvmId: string,
    deadline: number,
    signal: AbortSignal | undefined,
    before?: (probeSignal: AbortSignal) => Promise<void>,
    imageTimeoutMs?: number,
  ): Promise<MicrovmHandle> {
    const upstreamHeaders = { [INSTANCE_SECRET_HEADER]: entry.secret };
    await healthyOrExited(
      entry,
      async (probeSignal) => {
        await before?.(probeSignal);
        const bounds = { hostDeadline: deadline, imageTimeoutMs, signal: probeSignal };
        await withinImageShare(entry.output, bounds, async (readyBy, readySignal = probeSignal) => {
          const socket = await socketOf(join(entry.dir, "run"), readyBy, readySignal);
          entry.socket = socket;
          await waitForHealth({ socketPath: socket.path, headers: {} }, readyBy, upstreamHeaders, readySignal);
        });
      },
      signal,
    );
    noteMembers(entry);
    const pid = entry.launched.pid();
    entry.handle = {
      microvmId,
      provider,
      host: "",
      ports: {},
      socketPath: entry.socket!.path,
      ...(pid === undefined ? {} : { pid }),
      upstreamHeaders,
      startedAt: new Date().toISOString(),
    };
    return entry.handle;
  }

  return { assign, answering };
}

/** Waits for the runtime's socket to appear in `dir`; fails at once on anything else there. */
async function socketOf(dir: string, deadline: number, signal: AbortSignal): Promise<RuntimeSocket> {
  for (;;) {
    signal.throwIfAborted();
    const socket = openRuntimeSocket(dir);
    if (socket) return socket;
    if (Date.now() > deadline) throw new Error("the runtime did not create its socket in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Waits for the readiness probe, or fails as soon as the instance exits (an image that
 * throws while loading), with the last lines it wrote to stderr.
 */
async function healthyOrExited(
  entry: Tracked,
  probe: (signal: AbortSignal) => Promise<void>,
  signal: AbortSignal | undefined,
): Promise<void> {
  const stop = new AbortController();
  const died = entry.exited.then(() => {
    const tail = entry.output.stderrTail.join("\n");
    throw new Error(`instance exited before it was ready${tail ? `:\n${tail}` : ""}`);
  });
  died.catch(() => undefined);
  try {
    await Promise.race([probe(signal ? AbortSignal.any([signal, stop.signal]) : stop.signal), died]);
  } finally {
    stop.abort();
  }
}

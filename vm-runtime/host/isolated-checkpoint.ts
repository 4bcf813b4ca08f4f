// Checkpoint and restore of an isolated provider's instances, on walls that can (gVisor): a
// checkpoint asks the runtime (a line on its stdin) to close its socket, has the wall save the sandbox into an image
// directory and end, and writes what a restore needs beside it; a restore boots a wall from
// that image as the same uid with the same secret, tells the runtime on its stdin to listen
// again (read as soon as it runs: nothing polls the wall's state), and waits until it answers.
import { lstatSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { readSavedInstance, writeSavedInstance, type SavedInstance } from "./checkpoint-image.ts";
import { noteMembers, type Launcher, type Tracked, type WallOps } from "./isolated-walls.ts";
import { pollUntil, within } from "./provider-util.ts";
import { MicrovmProviderError, type MicrovmHandle, type RestoreSpec } from "./provider.ts";
import { RUNTIME_SOCKET_NAME } from "./runtime-socket.ts";
import { CLOSED_LINE, CONTROL_LINES } from "../runtime/boot.ts";
import { lineSeen } from "./process-io.ts";

/** What a restore may take on top of its timeout per MiB of its image (at least 10 MiB/s read). */
const RESTORE_MS_PER_MIB = 100;

/** MiB of the files in a checkpoint image directory. */
async function imageMiB(imageDir: string): Promise<number> {
  const names = await readdir(imageDir).catch(() => [] as string[]);
  const sizes = await Promise.all(
    names.map((name) =>
      stat(join(imageDir, name)).then(
        (info) => info.size,
        () => 0,
      ),
    ),
  );
  return Math.ceil(sizes.reduce((sum, size) => sum + size, 0) / (1024 * 1024));
}

/** What checkpoint and restore use of the provider that tracks the walls. */
export interface CheckpointDeps extends WallOps {
  readonly launcher: Launcher;
  /** How long a restored instance may take to answer. */
  readonly restoreTimeoutMs: number;
  closed(): boolean;
  /** The live wall of an instance; a MicrovmProviderError when it has none. */
  liveEntry(handle: MicrovmHandle): Tracked;
}

/** How long a runtime may take to close its listener before a checkpoint (milliseconds of work; a loaded host). */
const CLOSE_MS = 5_000;

/** `checkpoint` and `restore` of the provider (MicrovmProvider's optional pair). */
export function checkpointing(deps: CheckpointDeps) {
  /** Walls restored from an earlier runtime's checkpoint: told by signals, not control lines. */
  const signalled = new WeakSet<Tracked>();
  /**
   * Saves a live instance into `imageDir` and ends it: the runtime closes its socket (a wall
   * cannot save a bound host socket), the wall writes the image and exits, and the host adds
   * what a restore needs. Any failure ends the instance as well.
   */
  async function checkpoint(handle: MicrovmHandle, imageDir: string): Promise<void> {
    const entry = deps.liveEntry(handle);
    const { launched } = entry;
    if (!launched.checkpoint || !launched.signalRuntime || entry.uid === undefined)
      throw new MicrovmProviderError(`the ${deps.launcher.name} provider cannot checkpoint an instance`);
    // Its end is the checkpoint's doing, not news of an exit.
    entry.stopping = true;
    // The processes that must end before it counts as SUSPENDED (its release waits for them).
    noteMembers(entry);
    const saved: SavedInstance = {
      microvmId: handle.microvmId,
      uid: entry.uid,
      heapMiB: entry.heapMiB,
      secret: entry.secret,
      controlLines: true,
    };
    try {
      await entry.cgroup.thaw();
      if (signalled.has(entry)) {
        // A runtime of an earlier version says nothing once closed: its socket file going is the sign.
        await launched.signalRuntime();
        const socket = join(entry.dir, "run", RUNTIME_SOCKET_NAME);
        if (!(await pollUntil(() => !lstatSync(socket, { throwIfNoEntry: false }), 2_000)))
          throw new Error("the runtime did not close its socket");
      } else {
        const closed = lineSeen(entry.output, CLOSED_LINE, CLOSE_MS);
        launched.child.stdin?.write(`${CONTROL_LINES.close}\n`);
        if (!(await closed)) throw new Error("the runtime did not close its socket");
      }
      entry.socket?.close();
      await launched.checkpoint(imageDir);
      // Its uid is free again once released: a restore here takes it back.
      if (!(await within(entry.released!, 5_000))) throw new Error("the sandbox outlived its checkpoint");
      await writeSavedInstance(imageDir, saved);
    } catch (cause) {
      await deps.forceStop(entry).catch(() => undefined);
      await within(entry.exited, 5_000);
      throw new MicrovmProviderError(`instance ${handle.microvmId} could not be checkpointed`, { cause });
    }
  }

  /** Boots a wall restoring `imageDir` and waits for its runtime to listen and answer again. */
  async function restore(spec: RestoreSpec, imageDir: string, signal?: AbortSignal): Promise<MicrovmHandle> {
    const failed = (cause: unknown) =>
      new MicrovmProviderError(`instance ${spec.microvmId} could not be restored from its checkpoint`, { cause });
    if (!deps.launcher.restore)
      throw new MicrovmProviderError(`the ${deps.launcher.name} provider cannot restore an instance`);
    if (deps.closed()) throw new MicrovmProviderError("provider is closed");
    // runsc reads the whole image before the runtime runs: the bound grows with it.
    const deadline = Date.now() + deps.restoreTimeoutMs + RESTORE_MS_PER_MIB * (await imageMiB(imageDir));
    const saved = await readSavedInstance(imageDir).catch((cause: unknown) => {
      throw failed(cause);
    });
    if (saved.microvmId !== spec.microvmId) throw failed(new Error("the checkpoint is of another instance"));
    const entry = await deps.boot(saved.heapMiB, deadline, signal, { ...saved, imageDir }).catch((cause: unknown) => {
      throw failed(cause);
    });
    const { launched } = entry;
    try {
      await deps.assign(entry, spec.microvmId);
      // The restored runtime listens again once told: by a line it reads as soon as it runs,
      // or (an earlier runtime's checkpoint) by the signal once its wall runs.
      if (saved.controlLines) {
        launched.child.stdin?.write(`${CONTROL_LINES.listen}\n`);
        return await deps.answering(entry, spec.microvmId, deadline, signal);
      }
      signalled.add(entry);
      return await deps.answering(entry, spec.microvmId, deadline, signal, async (probeSignal) => {
        await launched.running!(deadline, probeSignal);
        await launched.signalRuntime!();
      });
    } catch (cause) {
      entry.stopping = true;
      await deps.forceStop(entry);
      await entry.exited;
      throw failed(cause);
    }
  }

  return { checkpoint, restore };
}

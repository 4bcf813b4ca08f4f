// Hibernation of objects (`hibernate: "snapshot"`): an idle activation's instance is
// checkpointed into the snapshot store (one snapshot per object, under its principal, counted
// against their snapshot quota) instead of being stopped, and the object's next activation, on
// any host, restores it from there with its memory. The snapshot goes once an activation runs
// again, restored or not: an older memory never comes back after a newer one ran.
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { join } from "node:path";
import { log } from "../../platform/index.ts";
import { readSavedInstance } from "../host/checkpoint-image.ts";
import type { MicrovmHandle, MicrovmProvider } from "../host/provider.ts";
import { LOCAL_SNAPSHOTS_DIR } from "../snapshots/keeper.ts";
import type { SnapshotStore } from "../snapshots/store.ts";
import { objectKey, type ObjectRef } from "./keys.ts";

/** The snapshots of a host's hibernating objects. */
export interface ObjectHibernation {
  /**
   * Checkpoints the object's instance `handle`, running the image version `imageDigest`, into
   * its snapshot; the instance ends either way. Rejects when nothing was stored (no room in the
   * quota, a checkpoint that failed). Once `signal` aborts nothing more is done, and a snapshot
   * stored after it is deleted: its caller gave it up (and let the object go on elsewhere).
   */
  save(object: ObjectRef, handle: MicrovmHandle, imageDigest: string, signal?: AbortSignal): Promise<void>;
  /**
   * Restores the object's instance from its snapshot: undefined when it has none; rejects when
   * it has one that cannot be restored (damaged, of another image version than `imageDigest`,
   * this host's provider cannot restore).
   */
  restore(object: ObjectRef, imageDigest: string, signal: AbortSignal): Promise<MicrovmHandle | undefined>;
  /** Deletes the object's snapshot, if any. */
  discard(object: ObjectRef): Promise<void>;
}

export interface ObjectHibernationOptions {
  readonly store: SnapshotStore;
  readonly provider: MicrovmProvider;
  /** The host's own directory: checkpoint images are written below it (and removed). */
  readonly workDir: string;
}

/** The id an object's snapshot is stored under, beside its principal's instances' snapshots. */
export const snapshotIdOf = (object: ObjectRef): string => `object.${objectKey(object)}`;

export function objectHibernation(options: ObjectHibernationOptions): ObjectHibernation {
  const { store, provider } = options;
  const imageDir = async () => {
    const parent = join(options.workDir, LOCAL_SNAPSHOTS_DIR);
    await mkdir(parent, { recursive: true, mode: 0o700 });
    return mkdtemp(join(parent, "object-"));
  };
  return {
    async save(object, handle, imageDigest, signal) {
      const { checkpoint } = provider;
      if (!checkpoint) throw new Error("this host's provider cannot checkpoint an instance");
      const id = snapshotIdOf(object);
      // Room for what it holds is reserved before the instance is touched: no room, no checkpoint.
      const estimate = (await provider.checkpointBound?.(handle)) ?? 0;
      await store.reserving(object.principal, id, estimate, async () => {
        const dir = await imageDir();
        try {
          signal?.throwIfAborted();
          await checkpoint.call(provider, handle, dir);
          signal?.throwIfAborted();
          await store.save(object.principal, id, dir, undefined, imageDigest);
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      });
      // Stored too late: an older memory must not come back after the object ran elsewhere.
      if (signal?.aborted) {
        await store.delete(object.principal, id);
        signal.throwIfAborted();
      }
    },
    async restore(object, imageDigest, signal) {
      const id = snapshotIdOf(object);
      const stored = await store.stored(object.principal, id);
      if (!stored) return undefined;
      // Its memory holds the code it ran: a newer version of the image starts afresh.
      if (stored.description !== imageDigest) throw new Error("the snapshot is of another version of the image");
      if (!provider.restore) throw new Error("this host's provider cannot restore an instance");
      const dir = await imageDir();
      try {
        await store.load(object.principal, id, stored, dir);
        // The instance restores under the id it was checkpointed with (named in its image).
        const { microvmId } = await readSavedInstance(dir);
        return await provider.restore({ microvmId }, dir, signal);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
    discard: (object) => store.delete(object.principal, snapshotIdOf(object)),
  };
}

/** What an activation starts from: its instance restored from its snapshot, or none. */
export interface Restored {
  /** The restored instance; undefined to start afresh. */
  readonly handle?: MicrovmHandle;
  /** The object had a snapshot (to delete once an activation runs). */
  readonly snapshot: boolean;
}

/**
 * The object's instance restored from its snapshot, if it has one that restores: one that
 * cannot be restored is logged, and the object starts afresh with its storage.
 */
export async function restoredOrFresh(
  hibernation: ObjectHibernation | undefined,
  object: ObjectRef,
  imageDigest: string,
  signal: AbortSignal,
): Promise<Restored> {
  if (!hibernation) return { snapshot: false };
  try {
    const handle = await hibernation.restore(object, imageDigest, signal);
    return handle ? { handle, snapshot: true } : { snapshot: false };
  } catch (err) {
    log.warn({ object: objectKey(object), err }, "an object's snapshot could not be restored: it starts afresh");
    return { snapshot: true };
  }
}

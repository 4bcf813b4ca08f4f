// One hosted instance's snapshots: suspend checkpoints it into a directory of the host's work
// directory and stores that in the snapshot store under its owner and id; resume loads it back
// (checked against the digest its record keeps) and restores it. The local copy is removed
// either way; the stored one when the instance is restored or ends. Room for the snapshot is
// reserved against its owner's quota before the checkpoint (the provider's bound of what it
// writes): one that would pass it is refused (SuspendRefused) and the instance runs on.
import { mkdtemp, rm } from "node:fs/promises";
import { join } from "node:path";
import { SuspendRefused, type SavedSnapshot } from "../lifecycle/types.ts";
import type { InstanceSnapshots } from "../lifecycle/instance.ts";
import type { MicrovmHandle, MicrovmProvider } from "../host/provider.ts";
import { SnapshotQuotaExceeded, type SnapshotStore } from "./store.ts";

export interface SnapshotKeeperOptions {
  readonly store: SnapshotStore;
  readonly provider: MicrovmProvider;
  /** The host's own directory (root's): checkpoint images are written below it. */
  readonly workDir: string;
  readonly owner: string;
  readonly microvmId: string;
  /** A snapshot of it is stored already (an adopted instance). */
  readonly stored?: boolean;
}

export interface SnapshotKeeper extends InstanceSnapshots {
  /** Deletes the stored snapshot (once a save under way has ended); nothing when it never saved one. */
  discard(): Promise<void>;
}

/** A refusal that came after the checkpoint: the instance runs on restored (`handle`). */
class CheckpointedRefusal extends SuspendRefused {}

/** The keeper of an instance, or undefined where its provider cannot checkpoint. */
export function snapshotKeeper(options: SnapshotKeeperOptions): SnapshotKeeper | undefined {
  const { store, provider, owner, microvmId } = options;
  const { checkpoint, restore } = provider;
  if (!checkpoint || !restore) return undefined;
  /** The last save, until it has ended; undefined while no snapshot was ever saved. */
  let saving: Promise<unknown> | undefined = options.stored ? Promise.resolve() : undefined;
  const withImageDir = async <T>(use: (dir: string) => Promise<T>): Promise<T> => {
    const dir = await mkdtemp(join(options.workDir, "snapshot-"));
    try {
      return await use(dir);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  };
  /** Bytes of its last stored snapshot: at least what the next one is expected to take. */
  let lastBytes = 0;
  const save = async (handle: MicrovmHandle): Promise<SavedSnapshot> => {
    // Room for what it holds is reserved before the instance is touched: no room, no checkpoint.
    const estimate = Math.max(lastBytes, (await provider.checkpointBound?.(handle)) ?? 0);
    try {
      return await store.reserving(owner, microvmId, estimate, () => withImageDir((dir) => saveFrom(handle, dir)));
    } catch (err) {
      if (err instanceof SnapshotQuotaExceeded) throw new SuspendRefused(err.message, err.quota);
      throw err;
    }
  };
  const saveFrom = async (handle: MicrovmHandle, dir: string): Promise<SavedSnapshot> => {
    await checkpoint.call(provider, handle, dir);
    try {
      const saved = await store.save(owner, microvmId, dir);
      lastBytes = saved.bytes;
      return saved;
    } catch (err) {
      if (!(err instanceof SnapshotQuotaExceeded)) throw err;
      lastBytes = Math.max(lastBytes, err.bytes);
      // Larger than its reservation and the room left: nothing was stored, and it runs on
      // from what it saved.
      const restored = await restore.call(provider, { microvmId }, dir);
      throw new CheckpointedRefusal(err.message, err.quota, restored);
    }
  };
  return {
    save(handle) {
      const saved = save(handle);
      saving = saved.catch(() => undefined);
      return saved;
    },
    async restore(saved, signal) {
      const handle = await withImageDir(async (dir) => {
        await store.load(owner, microvmId, saved, dir);
        return restore.call(provider, { microvmId }, dir, signal);
      });
      // Running again: the snapshot is stale, and counts against its owner's quota.
      await store.delete(owner, microvmId);
      return handle;
    },
    async discard() {
      // An instance never checkpointed has no snapshot: nothing to ask the store.
      if (!saving) return;
      await saving;
      await store.delete(owner, microvmId);
    },
  };
}

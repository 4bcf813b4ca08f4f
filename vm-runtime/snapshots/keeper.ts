// One hosted instance's snapshots: suspend checkpoints it into a directory of the host's work
// directory and stores that in the snapshot store under its owner and id; resume restores it.
// The image stays on this host's disk while the instance is SUSPENDED: a resume here restores
// from it (the store's copy is what any other host loads, checked against the record's digest).
// Both copies go once the instance runs again or ends. Room for the snapshot is reserved
// against its owner's quota before the checkpoint (the provider's bound of what it writes): one
// that would pass it is refused (SuspendRefused) and the instance runs on. Each step reports
// progress (the image growing, chunks moving), from which the lifecycle's deadline counts.
import { mkdir, mkdtemp, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { SuspendRefused, type SavedSnapshot } from "../lifecycle/types.ts";
import type { InstanceSnapshots } from "../lifecycle/instance.ts";
import type { MicrovmHandle, MicrovmProvider } from "../host/provider.ts";
import { SnapshotQuotaExceeded, type SnapshotStore } from "./store.ts";

/** The directory of a host's work directory that holds its snapshots' images (emptied at start). */
export const LOCAL_SNAPSHOTS_DIR = "snapshots";
/** How often a checkpoint's image is looked at for growth, and progress reported at most. */
const PROGRESS_MS = 1_000;

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
  /** Deletes the stored snapshot (once a save under way has ended) and the local image. */
  discard(): Promise<void>;
  /** Removes the local image only (another host took the instance and its stored snapshot). */
  release(): Promise<void>;
}

/** A refusal that came after the checkpoint: the instance runs on restored (`handle`). */
class CheckpointedRefusal extends SuspendRefused {}

/** The image this host made of the instance's last snapshot, and that snapshot's digest. */
interface LocalImage {
  readonly dir: string;
  readonly digest: string;
}

/** The keeper of an instance, or undefined where its provider cannot checkpoint. */
export function snapshotKeeper(options: SnapshotKeeperOptions): SnapshotKeeper | undefined {
  const { store, provider, owner, microvmId } = options;
  const { checkpoint, restore } = provider;
  if (!checkpoint || !restore) return undefined;
  /** The last save, until it has ended; undefined while no snapshot was ever saved. */
  let saving: Promise<unknown> | undefined = options.stored ? Promise.resolve() : undefined;
  let local: LocalImage | undefined;
  const dropLocal = async () => {
    const dir = local?.dir;
    local = undefined;
    if (dir) await rm(dir, { recursive: true, force: true });
  };
  const imageDir = async () => {
    const parent = join(options.workDir, LOCAL_SNAPSHOTS_DIR);
    await mkdir(parent, { recursive: true, mode: 0o700 });
    return mkdtemp(join(parent, "snapshot-"));
  };
  /** Bytes of its last stored snapshot: at least what the next one is expected to take. */
  let lastBytes = 0;
  const save = async (handle: MicrovmHandle, progress: () => void): Promise<SavedSnapshot> => {
    // Room for what it holds is reserved before the instance is touched: no room, no checkpoint.
    const estimate = Math.max(lastBytes, (await provider.checkpointBound?.(handle)) ?? 0);
    try {
      return await store.reserving(owner, microvmId, estimate, async () => {
        await dropLocal();
        const dir = await imageDir();
        try {
          const saved = await saveFrom(handle, dir, progress);
          local = { dir, digest: saved.digest };
          return saved;
        } catch (err) {
          await rm(dir, { recursive: true, force: true });
          throw err;
        }
      });
    } catch (err) {
      if (err instanceof SnapshotQuotaExceeded) throw new SuspendRefused(err.message, err.quota);
      throw err;
    }
  };
  const saveFrom = async (handle: MicrovmHandle, dir: string, progress: () => void): Promise<SavedSnapshot> => {
    await whileGrowing(dir, progress, () => checkpoint.call(provider, handle, dir));
    progress();
    try {
      const saved = await store.save(owner, microvmId, dir, progress);
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
  const restoreFrom = async (saved: SavedSnapshot, signal: AbortSignal, progress: () => void) => {
    // Its own image, when this host made the very snapshot the record names and still has it.
    if (local?.digest === saved.digest && (await exists(local.dir)))
      return restore.call(provider, { microvmId }, local.dir, signal);
    await dropLocal();
    const dir = await imageDir();
    try {
      await store.load(owner, microvmId, saved, dir, progress);
      progress();
      return await restore.call(provider, { microvmId }, dir, signal);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  };
  return {
    save(handle, progress = () => undefined) {
      const saved = save(handle, throttled(progress));
      saving = saved.catch(() => undefined);
      return saved;
    },
    async restore(saved, signal, progress = () => undefined) {
      const handle = await restoreFrom(saved, signal, throttled(progress));
      // Running again: the snapshot is stale, and counts against its owner's quota.
      await dropLocal();
      await store.delete(owner, microvmId);
      return handle;
    },
    async discard() {
      await dropLocal();
      // An instance never checkpointed has no snapshot: nothing to ask the store.
      if (!saving) return;
      await saving;
      await dropLocal();
      await store.delete(owner, microvmId);
    },
    release: dropLocal,
  };
}

/** `progress`, called at most once per PROGRESS_MS. */
function throttled(progress: () => void): () => void {
  let last = 0;
  return () => {
    const now = Date.now();
    if (now - last < PROGRESS_MS) return;
    last = now;
    progress();
  };
}

/** Runs `work` (which writes into `dir`), calling `progress` whenever the files in `dir` grew. */
async function whileGrowing<T>(dir: string, progress: () => void, work: () => Promise<T>): Promise<T> {
  let size = 0;
  const timer = setInterval(() => {
    void sizeOf(dir).then((now) => {
      if (now > size) progress();
      size = Math.max(size, now);
    });
  }, PROGRESS_MS);
  try {
    return await work();
  } finally {
    clearInterval(timer);
  }
}

const exists = (dir: string) =>
  stat(dir).then(
    () => true,
    () => false,
  );

async function sizeOf(dir: string): Promise<number> {
  const names = await readdir(dir).catch(() => []);
  const sizes = await Promise.all(
    names.map((name) =>
      stat(join(dir, name)).then(
        (info) => info.size,
        () => 0,
      ),
    ),
  );
  return sizes.reduce((sum, size) => sum + size, 0);
}

// Walls booted ahead of their instance: a start of the default heap size takes one and sends it
// its module, skipping the wall's and node's start-up. A failed boot is left to the next start.
// A wall is booted ahead at the background CPU weight, so that it takes only the CPU the host's
// launches and instances leave (a gVisor boot costs about a second of CPU); it gets the default
// weight once a launch takes it or waits for its boot. Walls are booted one at a time: what a
// boot does before runsc runs it (cgroups made and joined in every hierarchy, namespaces) takes
// the kernel's locks, not CPU that a weight orders, and ten boots at once behind a burst of ten
// launches held each launch up for a second (10 launches at once on 10 walls, provider alone:
// 1.0-2.5 s for the last with every wall booted again at once; 0.63-0.84 s one at a time).
import type { InstanceCgroup } from "./cgroups.ts";
import type { Tracked, WallWeight } from "./isolated-walls.ts";

export interface WarmPoolDeps {
  /** Walls kept waiting. */
  readonly target: number;
  /** The heap size warm walls are booted with: only starts of that size take one. */
  readonly heapMiB: number;
  readonly startTimeoutMs: number;
  /** Boots a wall (given up when `signal` aborts), its group at `weight`. */
  boot(heapMiB: number, deadline: number, signal: AbortSignal, weight: WallWeight): Promise<Tracked>;
  /** Ends a wall booted after the pool was closed. */
  stop(entry: Tracked): Promise<void>;
}

export interface WarmPool {
  /** Boots walls in the background until `target` wait. */
  refill(): void;
  /**
   * A warm wall of `heapMiB`, if one is waiting or being booted (a wall being booted ahead is
   * ready sooner than one booted now), at the default CPU weight; undefined for another heap
   * size or an empty pool.
   */
  take(heapMiB: number): Promise<Tracked | undefined>;
  /** Walls booted ahead whose runtime is up (its boot line printed), waiting for a launch now. */
  readonly ready: number;
  /** Gives up the walls being booted and waits for their boots to end. */
  close(reason: unknown): Promise<void>;
}

/** A wall's weight: the background one until `raise`, which resolves once the default one is written. */
interface Weight extends WallWeight {
  raise(): Promise<void>;
}

function backgroundWeight(): Weight {
  let group: InstanceCgroup | undefined;
  let raised: Promise<void> | undefined;
  // A group that is gone (its wall ended) needs no weight.
  const write = (cgroup: InstanceCgroup) => cgroup.weigh(false).catch(() => undefined);
  return {
    get background() {
      return raised === undefined;
    },
    placed(cgroup) {
      group = cgroup;
      if (raised) raised = write(cgroup);
    },
    raise() {
      raised ??= group ? write(group) : Promise.resolve();
      return raised;
    },
  };
}

/**
 * A wall booted ahead whose runtime is up: it printed its boot line and waits for its module. A
 * wall is handed over once runsc runs it, while node may still take a second or more to start
 * inside it: only an up one makes a launch about as quick as its image's import.
 */
const isUp = (wall: { readonly entry: Tracked }): boolean => !wall.entry.done && wall.entry.output.booted;

export function warmPool(deps: WarmPoolDeps): WarmPool {
  const warm: { readonly entry: Tracked; readonly weight: Weight }[] = [];
  /** Boots under way, each with its wall's weight. */
  const booting = new Map<Promise<unknown>, Weight>();
  // Walls booted ahead are given up at close, not waited for to come up.
  const closing = new AbortController();

  async function takeWaiting(heapMiB: number): Promise<Tracked | undefined> {
    if (heapMiB !== deps.heapMiB) return undefined;
    for (let i = warm.length - 1; i >= 0; i--) if (warm[i]!.entry.done) warm.splice(i, 1);
    // One whose runtime is up first; one still starting node is still sooner than a new boot.
    const up = warm.findIndex(isUp);
    const [wall] = warm.splice(Math.max(up, 0), 1);
    if (!wall) return undefined;
    // Before the launch renames its group.
    await wall.weight.raise();
    return wall.entry;
  }

  function refill(): void {
    // One boot at a time: the next starts once runsc runs the last one (after a failed one, at
    // the next start).
    if (!closing.signal.aborted && booting.size === 0 && warm.length < deps.target) {
      const weight = backgroundWeight();
      const deadline = Date.now() + deps.startTimeoutMs;
      const booted = deps
        .boot(deps.heapMiB, deadline, closing.signal, weight)
        .then(
          (entry) => {
            if (closing.signal.aborted) return deps.stop(entry).then(() => false);
            warm.push({ entry, weight });
            return true;
          },
          () => false,
        )
        .catch(() => false);
      booting.set(booted, weight);
      void booted.then((up) => {
        booting.delete(booted);
        if (up) refill();
      });
    }
  }

  return {
    refill,
    async take(heapMiB) {
      let entry = await takeWaiting(heapMiB);
      while (!entry && heapMiB === deps.heapMiB && booting.size > 0) {
        // Whichever boot ends first is this launch's: each boots at the default weight now.
        for (const weight of booting.values()) void weight.raise();
        await Promise.race(booting.keys());
        entry = await takeWaiting(heapMiB);
      }
      return entry;
    },
    get ready() {
      return warm.filter(isUp).length;
    },
    async close(reason) {
      closing.abort(reason);
      await Promise.allSettled(booting.keys());
    },
  };
}

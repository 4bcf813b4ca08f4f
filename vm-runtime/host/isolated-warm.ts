// Walls booted ahead of their instance: a start of the default heap size takes one and sends it
// its module, skipping the wall's and node's start-up. A failed boot is left to the next start.
import type { Tracked } from "./isolated-walls.ts";

export interface WarmPoolDeps {
  /** Walls kept waiting. */
  readonly target: number;
  /** The heap size warm walls are booted with: only starts of that size take one. */
  readonly heapMiB: number;
  readonly startTimeoutMs: number;
  /** Boots a wall (given up when `signal` aborts). */
  boot(heapMiB: number, deadline: number, signal: AbortSignal): Promise<Tracked>;
  /** Ends a wall booted after the pool was closed. */
  stop(entry: Tracked): Promise<void>;
}

export interface WarmPool {
  /** Boots walls in the background until `target` wait. */
  refill(): void;
  /**
   * A warm wall of `heapMiB`, if one is waiting or being booted (a wall being booted ahead is
   * ready sooner than one booted now); undefined for another heap size or an empty pool.
   */
  take(heapMiB: number): Promise<Tracked | undefined>;
  /** Gives up the walls being booted and waits for their boots to end. */
  close(reason: unknown): Promise<void>;
}

export function warmPool(deps: WarmPoolDeps): WarmPool {
  const warm: Tracked[] = [];
  const booting = new Set<Promise<unknown>>();
  // Walls booted ahead are given up at close, not waited for to come up.
  const closing = new AbortController();

  function takeWaiting(heapMiB: number): Tracked | undefined {
    if (heapMiB !== deps.heapMiB) return undefined;
    for (let entry = warm.shift(); entry; entry = warm.shift()) if (!entry.done) return entry;
    return undefined;
  }

  return {
    refill() {
      while (!closing.signal.aborted && warm.length + booting.size < deps.target) {
        const booted = deps.boot(deps.heapMiB, Date.now() + deps.startTimeoutMs, closing.signal).then(
          (entry) => {
            if (closing.signal.aborted) return deps.stop(entry);
            warm.push(entry);
          },
          () => undefined,
        );
        booting.add(booted);
        void booted.finally(() => booting.delete(booted));
      }
    },
    async take(heapMiB) {
      let entry = takeWaiting(heapMiB);
      while (!entry && heapMiB === deps.heapMiB && booting.size > 0) {
        await Promise.race(booting);
        entry = takeWaiting(heapMiB);
      }
      return entry;
    },
    async close(reason) {
      closing.abort(reason);
      await Promise.allSettled(booting);
    },
  };
}

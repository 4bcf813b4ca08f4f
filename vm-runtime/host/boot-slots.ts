// How many walls a host boots at once. A wall's boot (the wall itself, then node inside it) is
// CPU-bound: a burst of launches booted together shares the host's cores until all of them
// finish near the same late moment, and past the start timeout all of them fail. Booted a few
// at a time, in the order asked, the first are up at once and the rest follow in turn, and
// a launch that waits past its deadline fails alone (503, which the caller may retry).

/** A slot held for one boot; `release` is idempotent. */
export interface BootSlot {
  release(): void;
}

export interface BootSlots {
  /**
   * Waits for a free slot, first come first served; rejects with `late(waitedMs)` at
   * `deadline` (epoch ms), or with the signal's reason once it aborts.
   */
  take(deadline: number, signal: AbortSignal | undefined, late: (waitedMs: number) => Error): Promise<BootSlot>;
  /** Boots running now. */
  readonly running: number;
  /** Boots waiting for a slot now. */
  readonly waiting: number;
}

interface Waiter {
  grant(): void;
}

export function bootSlots(size: number): BootSlots {
  if (!(Number.isInteger(size) && size >= 1)) throw new RangeError(`boot slots must be an integer >= 1, not ${size}`);
  let running = 0;
  const queue: Waiter[] = [];

  const slot = (): BootSlot => {
    running++;
    let held = true;
    return {
      release() {
        if (!held) return;
        held = false;
        running--;
        queue.shift()?.grant();
      },
    };
  };

  return {
    get running() {
      return running;
    },
    get waiting() {
      return queue.length;
    },
    take(deadline, signal, late) {
      if (signal?.aborted) return Promise.reject(signal.reason);
      if (running < size && queue.length === 0) return Promise.resolve(slot());
      const askedAt = Date.now();
      return new Promise<BootSlot>((resolve, reject) => {
        const leave = (error: unknown) => {
          const at = queue.indexOf(waiter);
          if (at >= 0) queue.splice(at, 1);
          cleanup();
          reject(error);
        };
        const onAbort = () => leave(signal?.reason);
        const timer = setTimeout(() => leave(late(Date.now() - askedAt)), Math.max(0, deadline - Date.now()));
        const cleanup = () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
        };
        const waiter: Waiter = {
          grant() {
            cleanup();
            resolve(slot());
          },
        };
        queue.push(waiter);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    },
  };
}

// Cleanups that run in reverse order of registration, from one `after`/`t.after` hook,
// so a NATS server always outlives the clients and services started on it.

export type Defer = (cleanup: () => unknown) => void;

/** `lifo(after)` in a suite or `lifo((fn) => t.after(fn))` in a test. */
export function lifo(register: (hook: () => Promise<void>) => void): Defer {
  const cleanups: (() => unknown)[] = [];
  register(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });
  return (cleanup) => void cleanups.push(cleanup);
}

// Per-key mailboxes: work for one key runs one at a time, in arrival order; idle keys
// hold nothing, so the map is bounded by the keys with work in flight.

export class Mailboxes {
  readonly #tails = new Map<string, Promise<unknown>>();

  /** Runs `work` after every earlier piece of work for `key` has settled. */
  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const previous = this.#tails.get(key);
    const result = previous ? previous.then(work, work) : work();
    const tail = result.catch(() => undefined);
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return result;
  }

  /** Keys with work queued or running. */
  get size(): number {
    return this.#tails.size;
  }
}

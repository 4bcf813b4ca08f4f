// Per-key mailboxes: work for one key runs one at a time, in arrival order; a key's queue
// exists only while it has work, so the map is bounded by the keys with work in flight.

type Job = () => void;

export class Mailboxes {
  readonly #queues = new Map<string, Job[]>();

  /** Runs `work` after every earlier piece of work for `key` has settled. */
  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const job = () =>
        attempt(work).then(
          (value) => {
            resolve(value);
            this.#next(key);
          },
          (err: unknown) => {
            reject(err);
            this.#next(key);
          },
        );
      const queue = this.#queues.get(key);
      if (queue) {
        queue.push(job);
      } else {
        this.#queues.set(key, []);
        job();
      }
    });
  }

  /** Keys with work queued or running. */
  get size(): number {
    return this.#queues.size;
  }

  #next(key: string): void {
    const queue = this.#queues.get(key)!;
    const job = queue.shift();
    if (job) job();
    else this.#queues.delete(key);
  }
}

function attempt<T>(work: () => Promise<T>): Promise<T> {
  try {
    return work();
  } catch (err) {
    return Promise.reject(err);
  }
}

// Undo steps of a start that makes several resources: each deferred once its resource exists,
// run last first when a later step of the start fails, or when the whole is closed.

export class DeferStack {
  readonly #steps: (() => unknown)[] = [];

  /** Runs `step` at unwind, before every step deferred earlier. */
  defer(step: () => unknown): void {
    this.#steps.push(step);
  }

  /** Runs every step once, last first; rejects with the first failure after trying all. */
  async unwind(): Promise<void> {
    let failure: { readonly cause: unknown } | undefined;
    for (const step of this.#steps.splice(0).reverse()) {
      try {
        await step();
      } catch (cause) {
        failure ??= { cause };
      }
    }
    if (failure) throw failure.cause;
  }

  /** `make()`'s result; when it throws, unwinds what was deferred and rethrows its failure. */
  async unwindOnFailure<T>(make: () => Promise<T>): Promise<T> {
    try {
      return await make();
    } catch (err) {
      await this.unwind().catch(() => undefined);
      throw err;
    }
  }
}

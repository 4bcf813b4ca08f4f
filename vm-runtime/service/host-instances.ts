// This host's live instances and the launches under way, and the two limits they count
// against: the host's maximum of live instances and each principal's quota over every host.
// The one owner of that state: handlers reserve a slot, add what they launched, and the
// shutdown closes it and waits for the launches under way.
import { MicrovmLimitExceeded, MicrovmQuotaExceeded, ServiceUnavailable } from "../../schemas/index.ts";
import type { HostedInstance } from "./hosted.ts";
import { isTerminal, ownerOf, type MicrovmStore } from "./store.ts";

/** What a slot is taken for: an instance's launch, or an image push's check (a short-lived instance). */
export type SlotPurpose = "launch" | "image check";

export interface HostInstancesOptions {
  /** Instance records over every host: what a principal's quota counts. */
  readonly store: MicrovmStore;
  readonly maxInstances: number;
  /** Live instances per principal, over every host. */
  readonly quotaPerPrincipal: number;
}

export class HostInstances {
  readonly #hosted = new Map<string, HostedInstance>();
  /** Launches under way, by principal: they count against the limit and the quota. */
  readonly #launchingBy = new Map<string, number>();
  #launching = 0;
  #closing = false;
  /** Resolves the shutdown's wait once the last launch under way ended. */
  #drained: (() => void) | undefined;

  constructor(private readonly options: HostInstancesOptions) {}

  get(microvmId: string): HostedInstance | undefined {
    return this.#hosted.get(microvmId);
  }

  has(microvmId: string): boolean {
    return this.#hosted.has(microvmId);
  }

  ids(): string[] {
    return [...this.#hosted.keys()];
  }

  values(): HostedInstance[] {
    return [...this.#hosted.values()];
  }

  /** Keeps a launched (or adopted) instance, unless it has ended already. */
  add(hosted: HostedInstance): void {
    if (!isTerminal(hosted.state())) this.#hosted.set(hosted.microvmId, hosted);
  }

  /** Forgets an instance that is gone, unless another instance of that id took its place. */
  remove(gone: HostedInstance): void {
    if (this.#hosted.get(gone.microvmId) === gone) this.#hosted.delete(gone.microvmId);
  }

  get closing(): boolean {
    return this.#closing;
  }

  /** No slot from now on; resolves once the launches under way have ended. */
  async close(): Promise<void> {
    this.#closing = true;
    if (this.#launching > 0) await new Promise<void>((resolve) => (this.#drained = resolve));
  }

  /**
   * Reserves one live-instance slot of this host for `principal` (a launch, or the sandboxed
   * instance that checks a pushed image) and resolves with its release (idempotent). 503 while
   * the host closes (a retry lands on another host); 429 `MicrovmLimitExceeded` when the host
   * runs its maximum; 429 `MicrovmQuotaExceeded` when the principal runs its quota: records not
   * TERMINATED or FAILED on any host plus slots reserved here. Two hosts at once may both pass.
   */
  async reserve(principal: string, purpose: SlotPurpose): Promise<() => void> {
    const { maxInstances, quotaPerPrincipal, store } = this.options;
    if (this.#closing) throw ServiceUnavailable.make({});
    const why = purpose === "launch" ? "" : "checking an image runs it in an instance for a moment, and ";
    // An instance that reached TERMINATED is no longer live while its host cleans up after it.
    const live = this.values().filter((hosted) => !isTerminal(hosted.state())).length;
    if (live + this.#launching >= maxInstances) {
      throw MicrovmLimitExceeded.make({
        limit: maxInstances,
        message: `${why}this host runs its maximum of ${maxInstances} live instances: try again later`,
      });
    }
    // Reserved before the quota's read, so two requests here cannot both take the last slot.
    this.#launching += 1;
    this.#launchingBy.set(principal, (this.#launchingBy.get(principal) ?? 0) + 1);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.#launching -= 1;
      const left = this.#launchingBy.get(principal)! - 1;
      if (left > 0) this.#launchingBy.set(principal, left);
      else this.#launchingBy.delete(principal);
      if (this.#launching === 0) this.#drained?.();
    };
    try {
      const records = await store.list();
      const owned = records.filter(({ record }) => ownerOf(record) === principal && !isTerminal(record.state)).length;
      // This reservation is among `launchingBy`'s: the others are what it competes with.
      if (owned + this.#launchingBy.get(principal)! - 1 < quotaPerPrincipal) return release;
      throw MicrovmQuotaExceeded.make({
        quota: quotaPerPrincipal,
        message: `${why}you run your quota of ${quotaPerPrincipal} live instances: terminate one first`,
      });
    } catch (err) {
      release();
      throw err;
    }
  }
}

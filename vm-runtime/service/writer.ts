// The owner's writer of one instance record: writes run one at a time, a burst of changes
// collapses into one write of the latest record, and each write is a compare-and-set at the
// last revision this writer saw (re-read and re-applied on a conflict, a bounded number of times).
import { log } from "../../platform/index.ts";
import { isTerminal, type MicrovmRecord, type MicrovmStore } from "./store.ts";

export interface RecordWriterOptions {
  readonly store: MicrovmStore;
  /** The record as the instance is now; compared with the last write to skip no-op writes. */
  readonly current: () => MicrovmRecord;
  /**
   * What `signature(current())` would be, computed without building the record. Lets the
   * writer skip a change event (timer anchors, in-flight counts) before paying for the record.
   */
  readonly currentSignature?: () => string;
  /**
   * Someone else put the record into a terminal state (a host declared this one gone, an
   * operator) or another host adopted it: the owner must make the instance match. The stored
   * record is kept.
   */
  readonly onTakenOver: (stored: MicrovmRecord) => void;
}

const CONFLICT_ATTEMPTS = 8;

export class RecordWriter {
  readonly #options: RecordWriterOptions;
  #revision: number | undefined;
  #written = "";
  #running: Promise<void> | undefined;
  #closed = false;

  constructor(options: RecordWriterOptions) {
    this.#options = options;
  }

  /** Creates the record; false when the key exists already (nothing is written then). */
  async create(): Promise<boolean> {
    const record = this.#options.current();
    const revision = await this.#options.store.create(record);
    if (revision === undefined) return false;
    this.#revision = revision;
    this.#written = signature(record);
    return true;
  }

  /** Takes over a record stored at `revision` (an adopted instance's, claimed by the caller). */
  adopt(revision: number): void {
    this.#revision = revision;
    this.#written = signature(this.#options.current());
  }

  /** Writes nothing more (an instance that lost its record to another host). */
  close(): void {
    this.#stop();
  }

  /** The instance changed: write its record soon (after the create, one write at a time). */
  changed(): void {
    if (this.#revision === undefined || this.#closed) return;
    if (!this.#running && this.#options.currentSignature?.() === this.#written) return;
    this.#running ??= this.#drain().finally(() => (this.#running = undefined));
  }

  /** Resolves once every change so far is stored (or given up on). */
  async flush(): Promise<void> {
    this.changed();
    while (this.#running) await this.#running;
  }

  async #drain(): Promise<void> {
    for (;;) {
      if (this.#closed || this.#options.currentSignature?.() === this.#written) return;
      const record = this.#options.current();
      if (signature(record) === this.#written || this.#closed) return;
      try {
        await this.#write(record);
      } catch (err) {
        log.warn({ microvmId: record.microvmId, err }, "microvm record write failed");
        return;
      }
    }
  }

  async #write(record: MicrovmRecord): Promise<void> {
    const { store } = this.#options;
    for (let attempt = 0; attempt < CONFLICT_ATTEMPTS; attempt++) {
      const revision = await store.replace(record, this.#revision!);
      if (revision !== undefined) {
        this.#revision = revision;
        this.#written = signature(record);
        return;
      }
      const stored = await store.read(record.microvmId);
      if (!stored) return this.#stop();
      // A record someone else ended, or another host adopted, stays so; a live instance is made to match it.
      if (isTerminal(stored.record.state) || stored.record.hostId !== record.hostId) {
        this.#stop();
        if (!isTerminal(record.state)) this.#options.onTakenOver(stored.record);
        return;
      }
      this.#revision = stored.revision;
    }
    throw new Error("too many conflicting writes");
  }

  #stop(): void {
    this.#closed = true;
  }
}

/** What a write is about: state changes, not timer anchors or in-flight counts. */
function signature(record: MicrovmRecord): string {
  return recordSignature(record.state, record.stateReason, record.handle?.pid);
}

/** The signature of a record with these fields (what `currentSignature` must return). */
export function recordSignature(state: string, stateReason: string | undefined, pid: number | undefined): string {
  return JSON.stringify([state, stateReason ?? null, pid ?? null]);
}

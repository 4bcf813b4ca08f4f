// Instance records in the `microvms` KV bucket (key = the microvmId's KV key): the contract
// fields GetMicrovm answers plus the owning host, the provider handle and the lifecycle
// snapshot. Every write is compare-and-set: `create` for new keys, `update` at a revision.
import type { KV } from "@nats-io/kv";
import { JetStreamApiError, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import type { KvEntry } from "@nats-io/kv";
import { bucketNames, isWrongLastSequence, log } from "../../platform/index.ts";
import type { Static } from "@sinclair/typebox";
import { idKey, MICROVM_STATES, type IdlePolicy, type Microvm, type MicrovmState } from "../../schemas/index.ts";
import type { SavedSnapshot } from "../lifecycle/types.ts";

export type MicrovmView = Static<typeof Microvm>;
/** A contract state name. */
export type State = MicrovmState;
export type Policy = IdlePolicy;

/** The provider handle as stored: where the instance runs, without its per-instance secret. */
export interface StoredHandle {
  readonly provider: string;
  readonly host: string;
  readonly ports: Readonly<Record<string, number>>;
  readonly pid?: number;
  readonly pidStartTime?: number;
  readonly startedAt: string;
}

/** One instance as stored in KV. */
export interface MicrovmRecord extends MicrovmView {
  readonly state: State;
  /** The principal that launched it (absent in records older than owners: `anonymous`). */
  readonly owner?: string;
  /** The host that runs the instance; operations acting on it are forwarded there. */
  readonly hostId: string;
  readonly handle?: StoredHandle;
  /** `getPersistedSnapshot()` of the lifecycle machine at the last state change (secrets removed). */
  readonly snapshot?: unknown;
  /** The stored snapshot of a checkpointed SUSPENDED instance (its digest is checked on restore). */
  readonly checkpoint?: SavedSnapshot;
  /** ISO time of the last write. */
  readonly updatedAt: string;
  /** ISO time the record became TERMINATED or FAILED: retention counts from here. */
  readonly terminalAt?: string;
}

export interface StoredRecord {
  readonly record: MicrovmRecord;
  readonly revision: number;
}

/** States after which an instance never runs again. */
export const TERMINAL_STATES: readonly State[] = ["TERMINATED", "FAILED"];

export const isTerminal = (state: State): boolean => TERMINAL_STATES.includes(state);

/** The principal of HTTP callers when API keys are off (and of records without an owner). */
export const ANONYMOUS = "anonymous";

/** Who owns an instance: only that principal sees and acts on it. */
export const ownerOf = (record: MicrovmRecord): string => record.owner ?? ANONYMOUS;

/** How often a conflicting update is re-read and re-applied before giving up. */
const UPDATE_ATTEMPTS = 8;

export class MicrovmStore {
  #jsm: Promise<JetStreamManager> | undefined;

  /** `kv` is the bucket named `bucket` on `nc` (listing asks its stream directly). */
  constructor(
    readonly kv: KV,
    private readonly nc: NatsConnection,
    private readonly bucket: string = bucketNames.microvms,
  ) {}

  /** The record and its revision, or undefined when absent, deleted or not a valid key. */
  async read(microvmId: string): Promise<StoredRecord | undefined> {
    const key = idKey(microvmId);
    if (key === undefined) return undefined;
    return storedRecord(await this.kv.get(key));
  }

  /** Writes a new record; undefined when the key exists already (the stored one wins). */
  async create(record: MicrovmRecord): Promise<number | undefined> {
    try {
      return await this.kv.create(keyOf(record.microvmId), JSON.stringify(record));
    } catch (err) {
      if (isWrongSequence(err)) return undefined;
      throw err;
    }
  }

  /** Writes `record` if the stored revision is still `revision`; undefined on a conflict. */
  async replace(record: MicrovmRecord, revision: number): Promise<number | undefined> {
    try {
      return await this.kv.update(keyOf(record.microvmId), JSON.stringify(record), revision);
    } catch (err) {
      if (isWrongSequence(err)) return undefined;
      throw err;
    }
  }

  /**
   * Read-modify-write with a bounded retry on conflict. `change` returns the new record, or
   * undefined to leave it as it is. Resolves with what is stored afterwards (undefined: absent).
   */
  async update(
    microvmId: string,
    change: (stored: MicrovmRecord) => MicrovmRecord | undefined,
  ): Promise<StoredRecord | undefined> {
    for (let attempt = 0; attempt < UPDATE_ATTEMPTS; attempt++) {
      const stored = await this.read(microvmId);
      if (!stored) return undefined;
      const next = change(stored.record);
      if (!next) return stored;
      const revision = await this.replace(next, stored.revision);
      if (revision !== undefined) return { record: next, revision };
    }
    throw new Error(`microvm record ${microvmId}: too many conflicting writes`);
  }

  /**
   * Deletes the record if it is still at `revision` (false on a conflict), then purges the
   * key's delete marker so the bucket keeps nothing for it.
   */
  async remove(microvmId: string, revision: number): Promise<boolean> {
    const key = keyOf(microvmId);
    try {
      await this.kv.delete(key, { previousSeq: revision });
    } catch (err) {
      if (isWrongSequence(err)) return false;
      throw err;
    }
    const jsm = await this.manager();
    await jsm.streams.purge(`KV_${this.bucket}`, { filter: `$KV.${this.bucket}.${key}`, keep: 0 });
    return true;
  }

  /** Every stored record (reads run a few at a time). */
  async list(): Promise<StoredRecord[]> {
    const keys = await this.keys();
    const records: StoredRecord[] = [];
    for (let i = 0; i < keys.length; i += 32) {
      const batch = await Promise.all(keys.slice(i, i + 32).map((key) => this.readKey(key)));
      for (const entry of batch) if (entry) records.push(entry);
    }
    return records;
  }

  /**
   * The keys holding a message, from the stream's per-subject counts (one request, paged by
   * nats.js). `kv.keys()` is not used: its consumer can wait for an idle heartbeat (~30 s)
   * when records change while it lists, which these records do all the time.
   */
  private async keys(): Promise<string[]> {
    const jsm = await this.manager();
    const prefix = `$KV.${this.bucket}.`;
    const info = await jsm.streams.info(`KV_${this.bucket}`, { subjects_filter: `${prefix}>` });
    return Object.keys(info.state.subjects ?? {}).map((subject) => subject.slice(prefix.length));
  }

  private manager(): Promise<JetStreamManager> {
    return (this.#jsm ??= jetstreamManager(this.nc));
  }

  private async readKey(key: string): Promise<StoredRecord | undefined> {
    return storedRecord(await this.kv.get(key));
  }
}

/**
 * The record in `entry`, or undefined when absent, deleted or not of the shape this code
 * writes (a foreign or broken write): such a record is absent for every reader, so it fails
 * no list, sweep or quota count of others' instances.
 */
function storedRecord(entry: KvEntry | null): StoredRecord | undefined {
  if (entry?.operation !== "PUT" || entry.length === 0) return undefined;
  let value: unknown;
  try {
    value = entry.json();
  } catch {
    value = undefined;
  }
  if (isRecordShape(value)) return { record: value, revision: entry.revision };
  log.warn(
    { bucket: entry.bucket, key: entry.key, revision: entry.revision },
    "microvm record of the wrong shape ignored",
  );
  return undefined;
}

function isRecordShape(value: unknown): value is MicrovmRecord {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const r = value as Record<string, unknown>;
  const strings = ["microvmId", "imageIdentifier", "endpoint", "startedAt", "hostId", "updatedAt"] as const;
  const policy = r.idlePolicy as Record<string, unknown> | null | undefined;
  return (
    strings.every((field) => typeof r[field] === "string") &&
    (MICROVM_STATES as readonly unknown[]).includes(r.state) &&
    (r.owner === undefined || typeof r.owner === "string") &&
    typeof policy === "object" &&
    policy !== null &&
    typeof policy.maxIdleDurationSeconds === "number" &&
    typeof policy.suspendedDurationSeconds === "number" &&
    typeof policy.autoResumeEnabled === "boolean"
  );
}

/** The contract fields of a record (what GetMicrovm and ListMicrovms answer). */
export function viewOf(record: MicrovmRecord): MicrovmView {
  return {
    microvmId: record.microvmId,
    imageIdentifier: record.imageIdentifier,
    ...(record.imageDigest === undefined ? {} : { imageDigest: record.imageDigest }),
    state: record.state,
    ...(record.stateReason === undefined ? {} : { stateReason: record.stateReason }),
    endpoint: record.endpoint,
    idlePolicy: record.idlePolicy,
    startedAt: record.startedAt,
  };
}

/** `record` moved to a terminal state by someone other than its machine (reconcile, shutdown, a gone owner). */
export function terminated(record: MicrovmRecord, state: "TERMINATED" | "FAILED", stateReason: string): MicrovmRecord {
  const now = new Date().toISOString();
  return { ...record, state, stateReason, updatedAt: now, terminalAt: record.terminalAt ?? now };
}

function keyOf(microvmId: string): string {
  const key = idKey(microvmId);
  if (key === undefined) throw new Error("microvmId too long for a KV key");
  return key;
}

function isWrongSequence(err: unknown): boolean {
  return err instanceof JetStreamApiError && isWrongLastSequence(err.code);
}

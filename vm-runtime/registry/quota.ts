// A principal's quota of stored objects over every host (images, snapshots): what it stores is
// its objects in the store plus the writes under way, each reserved in a KV record of its own
// (`<owner>.usage` for images) before its object is written. A write reads the record, then
// lists the objects, and adds its reservation compare-and-set on the revision it read: a
// reservation removed meanwhile (its module now listed) fails the write, so no two pushes pass
// with the room for one. A reservation goes once its module is stored or its push failed; one
// whose push died lapses after RESERVATION_MS.
import type { KV, KvEntry } from "@nats-io/kv";
import { JetStreamApiError } from "@nats-io/jetstream";
import { isWrongLastSequence, log } from "../../platform/index.ts";
import { ImageQuotaExceeded, ServiceUnavailable } from "../../schemas/index.ts";
import type { ListedObject } from "./objects.ts";

/** A principal's stored-image allowance. */
export interface ImageQuota {
  /** Stored versions (default 50, `MICROVM_IMAGE_QUOTA_VERSIONS`). */
  readonly versions: number;
  /** Bytes of stored modules (default 64 MiB, `MICROVM_IMAGE_QUOTA_MIB`). */
  readonly bytes: number;
}

export const DEFAULT_IMAGE_QUOTA: ImageQuota = { versions: 50, bytes: 64 * 1024 * 1024 };

/** The stored-image quota's check: versions, then bytes. */
export const imageQuotaCheck =
  (quota: ImageQuota): QuotaCheck =>
  ({ versions, bytes }, adding) => {
    const more = adding > 0 ? 1 : 0;
    if (versions + more > quota.versions)
      throw ImageQuotaExceeded.make({
        limit: "versions",
        quota: quota.versions,
        message:
          `you store ${versions} image versions (old versions and pushes under way count), ` +
          `the most allowed is ${quota.versions}: delete an image first`,
      });
    if (bytes + adding > quota.bytes)
      throw ImageQuotaExceeded.make({
        limit: "bytes",
        quota: quota.bytes,
        message:
          `your images take ${bytes} bytes (old versions and pushes under way count); ` +
          `this module's ${adding} more would pass your quota of ${quota.bytes} bytes: delete an image first`,
      });
  };

/** Room held for a push under way, by the name of the object it writes. */
interface Reservation {
  readonly bytes: number;
  /** Epoch ms after which it no longer counts (its push died). */
  readonly until: number;
}
type Reservations = Record<string, Reservation>;

/** Longest a reservation holds: far past a push's writes (its name's lock holds 15 s). */
const RESERVATION_MS = 5 * 60_000;
/** Longest a push tries to write its reservation among others' before answering 503. */
const RESERVE_WAIT_MS = 10_000;

/** What a principal holds: its stored objects and the writes under way (reserved), counted together. */
export interface QuotaUsage {
  readonly versions: number;
  readonly bytes: number;
}

/** Throws the quota's refusal (a 429) when `adding` more bytes, as one more object, would pass it. */
export type QuotaCheck = (usage: QuotaUsage, adding: number) => void;

export class QuotaReservations {
  constructor(
    private readonly kv: KV,
    private readonly checkUsage: QuotaCheck,
    /** The KV key of a principal's reservations. */
    private readonly keyOf: (owner: string) => string,
    /** A principal's stored objects, read from the store's leader. */
    private readonly stored: (owner: string) => Promise<ListedObject[]>,
  ) {}

  /**
   * Runs `put` (the write of `object`, `bytes` long) with room reserved for it: 429 when the
   * principal's stored and reserved modules leave none. The reservation goes when `put`
   * settles; `undo` removes the object again when its reservation lapsed during `put` and the
   * principal is past its quota now (a push that stalled for minutes).
   */
  async within<T>(owner: string, object: string, bytes: number, put: () => Promise<T>, undo: () => Promise<void>) {
    await this.reserve(owner, object, bytes);
    let result: T;
    try {
      result = await put();
    } catch (err) {
      await this.release(owner, object).catch((failure: unknown) =>
        log.warn({ err: failure, owner }, "an image reservation was left to lapse"),
      );
      throw err;
    }
    if (!(await this.release(owner, object))) await this.recheck(owner, undo);
    return result;
  }

  /** The reservations of `owner` that still count (for tests and operators). */
  async reserved(owner: string): Promise<Reservations> {
    return live(await this.kv.get(this.keyOf(owner)));
  }

  private async reserve(owner: string, object: string, bytes: number): Promise<void> {
    const deadline = Date.now() + RESERVE_WAIT_MS;
    for (let pause = 5; ; pause = Math.min(pause * 2, 200)) {
      const entry = await this.kv.get(this.keyOf(owner));
      const reservations = live(entry);
      // Listed after the record was read: a module stored before is listed, or still reserved.
      this.check(await this.stored(owner), reservations, bytes);
      const next = { ...reservations, [object]: { bytes, until: Date.now() + RESERVATION_MS } };
      if (await this.write(owner, entry, next)) return;
      if (Date.now() > deadline)
        throw ServiceUnavailable.make({}, { cause: new Error(`image quota record of ${owner} stayed contended`) });
      await new Promise((resolve) => setTimeout(resolve, pause * (0.5 + Math.random())));
    }
  }

  /** Removes the reservation of `object`; false when it was no longer there (it lapsed). */
  private async release(owner: string, object: string): Promise<boolean> {
    for (;;) {
      const entry = await this.kv.get(this.keyOf(owner));
      const reservations = live(entry);
      if (!(object in reservations)) return false;
      delete reservations[object];
      if (await this.write(owner, entry, reservations)) return true;
    }
  }

  /** After a lapse: undoes the push when the principal is now past its quota. */
  private async recheck(owner: string, undo: () => Promise<void>): Promise<void> {
    try {
      this.check(await this.stored(owner), await this.reserved(owner), 0);
    } catch (err) {
      await undo();
      throw err;
    }
  }

  /** 429 when `adding` more bytes as one more object would pass the quota. */
  private check(stored: readonly ListedObject[], reservations: Reservations, adding: number): void {
    const listed = new Set(stored.map((object) => object.name));
    // A reservation whose object is listed already is counted once, as the object.
    const pending = Object.entries(reservations).filter(([object]) => !listed.has(object));
    const versions = stored.length + pending.length;
    const bytes =
      stored.reduce((sum, object) => sum + object.size, 0) + pending.reduce((sum, [, held]) => sum + held.bytes, 0);
    this.checkUsage({ versions, bytes }, adding);
  }

  /** Writes `reservations` over `entry` compare-and-set; false when another write came first. */
  private async write(owner: string, entry: KvEntry | null, reservations: Reservations): Promise<boolean> {
    const value = JSON.stringify({ reservations });
    const key = this.keyOf(owner);
    try {
      if (entry) await this.kv.update(key, value, entry.revision);
      else await this.kv.create(key, value);
      return true;
    } catch (err) {
      if (err instanceof JetStreamApiError && isWrongLastSequence(err.code)) return false;
      throw err;
    }
  }
}

/** The reservations of a record that have not lapsed; none for a record of another shape. */
function live(entry: KvEntry | null): Reservations {
  if (entry?.operation !== "PUT" || entry.length === 0) return {};
  let reservations: unknown;
  try {
    reservations = entry.json<{ reservations?: unknown }>().reservations;
  } catch {
    return {};
  }
  if (typeof reservations !== "object" || reservations === null) return {};
  const now = Date.now();
  const kept: Reservations = {};
  for (const [object, held] of Object.entries(reservations as Record<string, Partial<Reservation>>)) {
    if (typeof held?.bytes === "number" && typeof held.until === "number" && held.until > now)
      kept[object] = { bytes: held.bytes, until: held.until };
  }
  return kept;
}

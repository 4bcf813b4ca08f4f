// Instance snapshots in the JetStream Object Store `snapshots`: one object per owner and
// instance (`<owner token>/<id token>`), the packed checkpoint image, streamed from its files
// into the store and back (never whole in memory; a few transfers at a time, the rest queued).
// The record keeps its digest; a load reads it back with no consumer (registry/objects.ts),
// checks it against that digest and unpacks it with a bound. Every owner's snapshots count
// against a byte quota, reserved before the checkpoint (registry/quota.ts, as image pushes).
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";
import { Objm, setSha256Backend, type ObjectStore } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import { ensureStreamSettings, provisionedStream, snapshotObjectBucket } from "../../platform/index.ts";
import { nameToken, ServiceUnavailable } from "../../schemas/index.ts";
import { bootSlots, type BootSlots } from "../host/boot-slots.ts";
import { CorruptObject, listObjects, ObjectReplaced, openObject, parseDigest } from "../registry/objects.ts";
import { QuotaReservations, type QuotaCheck } from "../registry/quota.ts";
import { packSnapshot, SnapshotArchiveError, unpackSnapshot } from "./archive.ts";
import { noteMoved } from "./young-garbage.ts";

// nats.js hashes what it stores in JavaScript unless told to use node's crypto: a third of a
// 15 MiB snapshot's save went to that (460 -> 125 ms). Process-wide, set before any put.
setSha256Backend("native");

const MiB = 1024 * 1024;
export const DEFAULT_SNAPSHOT_STORE_MIB = 1024;
/** Default bytes of stored snapshots per owner (`MICROVM_SNAPSHOT_QUOTA_MIB`). */
export const DEFAULT_SNAPSHOT_QUOTA_BYTES = 256 * MiB;
/** Largest snapshot stored or read (an instance's memory cap is far below). */
const MAX_SNAPSHOT_BYTES = 2048 * MiB;
/**
 * Snapshots moving between this host's disk and the store at once; the rest wait their turn.
 * Each holds about two object chunks in the service's memory, whatever the instance holds.
 */
export const SNAPSHOT_TRANSFERS = 2;
/** Bytes per stored chunk (nats.js lowers it to the server's max_payload). */
const CHUNK_BYTES = 1024 * 1024;
/** Longest a transfer waits for its turn: past any suspend's or resume's own deadline. */
const TRANSFER_WAIT_MS = 10 * 60_000;

/** What the instance's record keeps of its stored snapshot. */
export interface StoredSnapshot {
  /** `sha256:<hex>` of the stored object's bytes. */
  readonly digest: string;
  /** Bytes stored, as checkpointed (uncompressed): what counts against the owner's quota. */
  readonly bytes: number;
  readonly createdAt: string;
}

/** A snapshot that is missing, damaged or not the one its record names. */
export class SnapshotError extends Error {
  override readonly name = "SnapshotError";
}

/** Storing the snapshot would take its owner past their snapshot quota. */
export class SnapshotQuotaExceeded extends Error {
  override readonly name = "SnapshotQuotaExceeded";
  constructor(
    message: string,
    /** Bytes of the snapshot refused. */
    readonly bytes: number,
    /** The owner's quota in bytes. */
    readonly quota: number,
  ) {
    super(message);
  }
}

export interface SnapshotStoreOptions {
  /** The KV bucket that holds each owner's reservations (`<owner token>.snapshots`). */
  readonly kv: KV;
  readonly replicas?: number;
  /** `max_bytes` of the bucket in MiB (`MICROVM_SNAPSHOT_STORE_MIB`, default 1024). */
  readonly storeMiB?: number;
  /** Bytes of stored snapshots one owner may have (default 256 MiB). */
  readonly quotaBytes?: number;
  /** Snapshots stored or loaded at once (default SNAPSHOT_TRANSFERS). */
  readonly transfers?: number;
}

const ownerPrefix = (owner: string) => `${nameToken(owner)}/`;
const objectName = (owner: string, microvmId: string) => `${ownerPrefix(owner)}${nameToken(microvmId)}`;
const reservationKey = (owner: string) => `${nameToken(owner)}.snapshots`;
const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB (${bytes} bytes)`;
const refusal = (held: number, quota: number, bytes: number) =>
  `your snapshots take ${mib(held)} of your snapshot quota of ${mib(quota)}, ` +
  `and this one would take ${mib(bytes)} more: terminate or resume a suspended instance first`;

export class SnapshotStore {
  #jsm: Promise<JetStreamManager> | undefined;
  readonly #reservations: QuotaReservations;
  readonly #transfers: BootSlots;
  /** The progress callbacks of the saves and loads under way or waiting their turn. */
  readonly #moving = new Set<() => void>();

  private constructor(
    private readonly nc: NatsConnection,
    private readonly objects: ObjectStore,
    kv: KV,
    readonly quotaBytes: number,
    transfers: number,
  ) {
    const check: QuotaCheck = ({ bytes }, adding) => {
      if (bytes + adding > quotaBytes)
        throw new SnapshotQuotaExceeded(refusal(bytes, quotaBytes, adding), adding, quotaBytes);
    };
    this.#reservations = new QuotaReservations(kv, check, reservationKey, (owner) =>
      this.#objectsUnder(ownerPrefix(owner)),
    );
    this.#transfers = bootSlots(transfers);
  }

  /** Creates the bucket, or brings an existing one to these limits (the provisioning credential's work). */
  static async provision(nc: NatsConnection, options: Pick<SnapshotStoreOptions, "replicas" | "storeMiB"> = {}) {
    const storeBytes = (options.storeMiB ?? DEFAULT_SNAPSHOT_STORE_MIB) * MiB;
    await new Objm(nc).create(snapshotObjectBucket, { replicas: options.replicas ?? 1, max_bytes: storeBytes });
    await ensureStreamSettings(nc, `OBJ_${snapshotObjectBucket}`, { max_bytes: storeBytes, allow_direct: true });
  }

  /** Opens the bucket as it is (`StoreNotProvisioned` when it is missing). */
  static async open(
    nc: NatsConnection,
    options: Pick<SnapshotStoreOptions, "kv" | "quotaBytes" | "transfers">,
  ): Promise<SnapshotStore> {
    await provisionedStream(nc, `OBJ_${snapshotObjectBucket}`);
    const objects = await new Objm(nc).open(snapshotObjectBucket, false);
    return new SnapshotStore(
      nc,
      objects,
      options.kv,
      options.quotaBytes ?? DEFAULT_SNAPSHOT_QUOTA_BYTES,
      options.transfers ?? SNAPSHOT_TRANSFERS,
    );
  }

  /**
   * Runs `work` (a checkpoint and its `save`) with `estimate` bytes reserved for `owner`'s
   * snapshot of `microvmId`: `SnapshotQuotaExceeded` before `work` runs when their stored
   * snapshots and the saves under way on any host leave no room for it.
   */
  reserving<T>(owner: string, microvmId: string, estimate: number, work: () => Promise<T>): Promise<T> {
    // A reservation lapses after minutes, far past a suspend's deadline: nothing to undo.
    return this.#reservations.within(owner, objectName(owner, microvmId), estimate, work, async () => undefined);
  }

  /**
   * Stores the checkpoint image in `imageDir` as `owner`'s snapshot of `microvmId` (replacing
   * an earlier one), streamed from its files. `SnapshotQuotaExceeded` when the owner's other
   * snapshots and this one would pass the quota; nothing is stored then. `progress` is called
   * whenever a chunk of any transfer moved, this one's or those it waits behind.
   */
  async save(
    owner: string,
    microvmId: string,
    imageDir: string,
    progress?: () => void,
    /** Kept beside it (`stored` reads it back). */
    description?: string,
  ): Promise<StoredSnapshot> {
    const packed = await packSnapshot(imageDir);
    const why = await this.overQuota(owner, microvmId, packed.bytes);
    if (why) throw new SnapshotQuotaExceeded(why, packed.bytes, this.quotaBytes);
    if (packed.bytes > MAX_SNAPSHOT_BYTES)
      throw new SnapshotQuotaExceeded(
        `the snapshot has ${packed.bytes} bytes, more than ${MAX_SNAPSHOT_BYTES}`,
        packed.bytes,
        this.quotaBytes,
      );
    const chunks = packed.chunks[Symbol.asyncIterator]();
    const moved = (bytes: number) => this.#moved(bytes);
    // Pulled as the store writes: one chunk is read from disk when the last was acknowledged.
    const body = new ReadableStream<Uint8Array>(
      {
        async pull(controller) {
          const next = await chunks.next();
          if (next.done) return controller.close();
          moved(next.value.byteLength);
          controller.enqueue(next.value);
        },
        async cancel() {
          await chunks.return?.();
        },
      },
      { highWaterMark: 0 },
    );
    const info = await this.#transfer(progress, () =>
      this.objects.put(
        {
          name: objectName(owner, microvmId),
          ...(description === undefined ? {} : { description }),
          options: { max_chunk_size: CHUNK_BYTES },
        },
        body,
      ),
    );
    if (info.size !== packed.bytes) throw new SnapshotError(`the snapshot of ${microvmId} changed while it was stored`);
    // The store's own SHA-256 of what it holds, the one a load checks the chunks against.
    const digest = parseDigest(info.digest);
    if (!digest) throw new SnapshotError(`the snapshot of ${microvmId} was stored without its digest`);
    return { digest: `sha256:${digest.toString("hex")}`, bytes: info.size, createdAt: new Date().toISOString() };
  }

  /**
   * Why a snapshot of `bytes` for `owner`'s `microvmId` would pass the owner's quota (their
   * other snapshots and others' reservations counted), or undefined when it fits.
   */
  async overQuota(owner: string, microvmId: string, bytes: number): Promise<string | undefined> {
    const name = objectName(owner, microvmId);
    const reserved = await this.#reservations.reserved(owner);
    const others = (await this.#objectsUnder(ownerPrefix(owner))).filter((object) => object.name !== name);
    const listed = new Set(others.map((object) => object.name));
    const held =
      others.reduce((sum, object) => sum + object.size, 0) +
      Object.entries(reserved)
        .filter(([object]) => object !== name && !listed.has(object))
        .reduce((sum, [, reservation]) => sum + reservation.bytes, 0);
    if (held + bytes <= this.quotaBytes) return undefined;
    return refusal(held, this.quotaBytes, bytes);
  }

  /**
   * Unpacks `owner`'s snapshot of `microvmId` into `dir` (empty, the host's), once it matches
   * `expected`; `progress` as for `save`.
   */
  async load(
    owner: string,
    microvmId: string,
    expected: Pick<StoredSnapshot, "digest">,
    dir: string,
    progress?: () => void,
  ): Promise<void> {
    const name = objectName(owner, microvmId);
    const damaged = (cause: unknown) => new SnapshotError(`the snapshot of ${microvmId} is damaged`, { cause });
    await this.#transfer(progress, async () => {
      const jsm = await this.#manager();
      const opened = await openObject(jsm, this.objects, name, MAX_SNAPSHOT_BYTES).catch((cause: unknown) => {
        throw cause instanceof CorruptObject ? damaged(cause) : cause;
      });
      if (!opened) throw new SnapshotError(`the snapshot of ${microvmId} is missing`);
      // Its meta names its digest, which its chunks are checked against: another object than
      // the record's is refused before a byte of it is read.
      if (`sha256:${opened.sha256.toString("hex")}` !== expected.digest)
        throw new SnapshotError(`the snapshot of ${microvmId} does not match the digest on its record`);
      try {
        await unpackSnapshot(this.#counted(opened.chunks), dir, MAX_SNAPSHOT_BYTES);
      } catch (cause) {
        if (cause instanceof ObjectReplaced) throw new SnapshotError(`the snapshot of ${microvmId} is missing`);
        if (cause instanceof SnapshotArchiveError || cause instanceof CorruptObject) throw damaged(cause);
        throw cause;
      }
    });
  }

  /**
   * The digest, size and description (as `save` was given it) of `owner`'s stored snapshot of
   * `microvmId`; undefined when there is none.
   */
  async stored(
    owner: string,
    microvmId: string,
  ): Promise<(Pick<StoredSnapshot, "digest" | "bytes"> & { readonly description: string }) | undefined> {
    const info = await this.objects.info(objectName(owner, microvmId));
    const digest = info && !info.deleted ? parseDigest(info.digest) : undefined;
    if (!info || !digest) return undefined;
    return { digest: `sha256:${digest.toString("hex")}`, bytes: info.size, description: info.description ?? "" };
  }

  /** Deletes `owner`'s snapshot of `microvmId`; nothing when there is none. */
  async delete(owner: string, microvmId: string): Promise<void> {
    const name = objectName(owner, microvmId);
    const info = await this.objects.info(name);
    if (info && !info.deleted) await this.objects.delete(name);
  }

  /** Bytes of `owner`'s stored snapshots. */
  async bytesOf(owner: string): Promise<number> {
    return (await this.#objectsUnder(ownerPrefix(owner))).reduce((sum, object) => sum + object.size, 0);
  }

  /** Transfers under way and waiting (tests and metrics). */
  get transfers(): { readonly running: number; readonly waiting: number } {
    return { running: this.#transfers.running, waiting: this.#transfers.waiting };
  }

  async #transfer<T>(progress: (() => void) | undefined, work: () => Promise<T>): Promise<T> {
    if (progress) this.#moving.add(progress);
    try {
      return await this.#inTurn(work);
    } finally {
      if (progress) this.#moving.delete(progress);
    }
  }

  /** Counts a chunk moved: young garbage collected now and then, and every transfer's progress. */
  #moved(bytes: number): void {
    noteMoved(bytes);
    for (const progress of this.#moving) progress();
  }

  async *#counted(chunks: AsyncIterable<Uint8Array>) {
    for await (const chunk of chunks) {
      this.#moved(chunk.byteLength);
      yield chunk;
    }
  }

  async #inTurn<T>(work: () => Promise<T>): Promise<T> {
    const slot = await this.#transfers.take(Date.now() + TRANSFER_WAIT_MS, undefined, (waited) =>
      ServiceUnavailable.make({}, { cause: new Error(`a snapshot waited ${waited} ms for its turn`) }),
    );
    try {
      return await work();
    } finally {
      slot.release();
    }
  }

  async #objectsUnder(prefix: string) {
    return listObjects(await this.#manager(), this.objects, snapshotObjectBucket, prefix);
  }

  #manager(): Promise<JetStreamManager> {
    return (this.#jsm ??= jetstreamManager(this.nc));
  }
}

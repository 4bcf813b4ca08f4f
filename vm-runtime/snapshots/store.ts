// Instance snapshots in the JetStream Object Store `snapshots`: one object per owner and
// instance (`<owner token>/<id token>`), the packed and compressed checkpoint image. The record
// keeps its digest; a load reads it back with no consumer (registry/objects.ts), checks it against
// that digest and unpacks it with a bound. Every owner's snapshots count against a byte quota.
import { createHash } from "node:crypto";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { Objm, type ObjectStore } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import { ensureStreamSettings, provisionedStream, snapshotObjectBucket } from "../../platform/index.ts";
import { nameToken } from "../../schemas/index.ts";
import { CorruptObject, listObjects, readObject } from "../registry/objects.ts";
import { packSnapshot, SnapshotArchiveError, unpackSnapshot } from "./archive.ts";

const MiB = 1024 * 1024;
export const DEFAULT_SNAPSHOT_STORE_MIB = 1024;
/** Default bytes of stored snapshots per owner (`MICROVM_SNAPSHOT_QUOTA_MIB`). */
export const DEFAULT_SNAPSHOT_QUOTA_BYTES = 256 * MiB;
/** Largest snapshot stored or read, packed (an instance's memory cap is far below). */
const MAX_SNAPSHOT_BYTES = 1024 * MiB;
/** Largest snapshot once decompressed. */
const MAX_UNPACKED_BYTES = 2048 * MiB;

/** What the instance's record keeps of its stored snapshot. */
export interface StoredSnapshot {
  /** `sha256:<hex>` of the stored object's bytes. */
  readonly digest: string;
  /** Bytes stored (packed and compressed): what counts against the owner's quota. */
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
  ) {
    super(message);
  }
}

export interface SnapshotStoreOptions {
  readonly replicas?: number;
  /** `max_bytes` of the bucket in MiB (`MICROVM_SNAPSHOT_STORE_MIB`, default 1024). */
  readonly storeMiB?: number;
  /** Bytes of stored snapshots one owner may have (default 256 MiB). */
  readonly quotaBytes?: number;
}

const ownerPrefix = (owner: string) => `${nameToken(owner)}/`;
const objectName = (owner: string, microvmId: string) => `${ownerPrefix(owner)}${nameToken(microvmId)}`;
const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB (${bytes} bytes)`;
const digestOf = (bytes: Uint8Array) => `sha256:${createHash("sha256").update(bytes).digest("hex")}`;

export class SnapshotStore {
  #jsm: Promise<JetStreamManager> | undefined;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly objects: ObjectStore,
    readonly quotaBytes: number,
  ) {}

  /** Creates the bucket, or brings an existing one to these limits (the provisioning credential's work). */
  static async provision(nc: NatsConnection, options: Pick<SnapshotStoreOptions, "replicas" | "storeMiB"> = {}) {
    const storeBytes = (options.storeMiB ?? DEFAULT_SNAPSHOT_STORE_MIB) * MiB;
    await new Objm(nc).create(snapshotObjectBucket, { replicas: options.replicas ?? 1, max_bytes: storeBytes });
    await ensureStreamSettings(nc, `OBJ_${snapshotObjectBucket}`, { max_bytes: storeBytes, allow_direct: true });
  }

  /** Opens the bucket as it is (`StoreNotProvisioned` when it is missing). */
  static async open(
    nc: NatsConnection,
    options: Pick<SnapshotStoreOptions, "quotaBytes"> = {},
  ): Promise<SnapshotStore> {
    await provisionedStream(nc, `OBJ_${snapshotObjectBucket}`);
    const objects = await new Objm(nc).open(snapshotObjectBucket, false);
    return new SnapshotStore(nc, objects, options.quotaBytes ?? DEFAULT_SNAPSHOT_QUOTA_BYTES);
  }

  /**
   * Stores the checkpoint image in `imageDir` as `owner`'s snapshot of `microvmId` (replacing
   * an earlier one). `SnapshotQuotaExceeded` when the owner's other snapshots and this one
   * would pass the quota; nothing is stored then.
   */
  async save(owner: string, microvmId: string, imageDir: string): Promise<StoredSnapshot> {
    const packed = await packSnapshot(imageDir);
    if (packed.length > MAX_SNAPSHOT_BYTES)
      throw new SnapshotQuotaExceeded(
        `the snapshot has ${packed.length} bytes, more than ${MAX_SNAPSHOT_BYTES}`,
        packed.length,
      );
    const refusal = await this.overQuota(owner, microvmId, packed.length);
    if (refusal) throw new SnapshotQuotaExceeded(refusal, packed.length);
    await this.objects.putBlob({ name: objectName(owner, microvmId) }, packed);
    return { digest: digestOf(packed), bytes: packed.length, createdAt: new Date().toISOString() };
  }

  /**
   * Why a snapshot of `bytes` for `owner`'s `microvmId` would pass the owner's quota (their
   * other snapshots counted), or undefined when it fits.
   */
  async overQuota(owner: string, microvmId: string, bytes: number): Promise<string | undefined> {
    const name = objectName(owner, microvmId);
    const others = (await this.#objectsUnder(ownerPrefix(owner))).filter((object) => object.name !== name);
    const held = others.reduce((sum, object) => sum + object.size, 0);
    if (held + bytes <= this.quotaBytes) return undefined;
    return `your snapshots take ${mib(held)} of your snapshot quota of ${mib(this.quotaBytes)}, and this one would take ${mib(bytes)} more: terminate or resume a suspended instance first`;
  }

  /** Unpacks `owner`'s snapshot of `microvmId` into `dir` (empty, the host's), once it matches `expected`. */
  async load(owner: string, microvmId: string, expected: Pick<StoredSnapshot, "digest">, dir: string): Promise<void> {
    const name = objectName(owner, microvmId);
    let packed: Uint8Array | undefined;
    try {
      packed = await readObject(await this.#manager(), this.objects, name, MAX_SNAPSHOT_BYTES);
    } catch (cause) {
      if (cause instanceof CorruptObject) throw new SnapshotError(`the snapshot of ${microvmId} is damaged`, { cause });
      throw cause;
    }
    if (!packed) throw new SnapshotError(`the snapshot of ${microvmId} is missing`);
    if (digestOf(packed) !== expected.digest)
      throw new SnapshotError(`the snapshot of ${microvmId} does not match the digest on its record`);
    try {
      await unpackSnapshot(packed, dir, MAX_UNPACKED_BYTES);
    } catch (cause) {
      if (cause instanceof SnapshotArchiveError)
        throw new SnapshotError(`the snapshot of ${microvmId} is damaged`, { cause });
      throw cause;
    }
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

  async #objectsUnder(prefix: string) {
    return listObjects(await this.#manager(), this.objects, snapshotObjectBucket, prefix);
  }

  #manager(): Promise<JetStreamManager> {
    return (this.#jsm ??= jetstreamManager(this.nc));
  }
}

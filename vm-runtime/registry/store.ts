// Registered images: modules in the JetStream Object Store `images` (one object per owner,
// name and digest), metadata in the KV bucket `images`, keyed by owner. Writes to one name
// (push, delete) take its lock, so a record never names a missing object and no object
// outlives its name. A host fetches a module by digest on first use, checks its sha256 and
// keeps it in its bounded module cache. Objects are read with no consumer (objects.ts).
import { createHash } from "node:crypto";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { Kvm, type KV } from "@nats-io/kv";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { Objm, type ObjectStore } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  bucketNames,
  ensureStreamSettings,
  imageObjectBucket,
  log,
  openBuckets,
  provisionedStream,
} from "../../platform/index.ts";
import { MAX_IMAGE_MODULE_BYTES, nameToken } from "../../schemas/index.ts";
import type { MethodDescription } from "../runtime/server.ts";
import { afterDelete, withNameLock } from "./lock.ts";
import { listObjects, readObject } from "./objects.ts";
import { DEFAULT_IMAGE_CACHE_MIB, ModuleCache } from "./module-cache.ts";
import { DEFAULT_IMAGE_QUOTA, imageQuotaCheck, QuotaReservations, type ImageQuota } from "./quota.ts";

/** The owner of the built-in images, which every principal sees (no principal has a `~`-prefixed name here). */
export const BUILTIN_OWNER = "~builtin";

/** One registered version of an image, as stored. */
export interface ImageRecord {
  readonly name: string;
  /** `sha256:<hex>` of the module. */
  readonly digest: string;
  readonly methods: readonly MethodDescription[];
  readonly createdAt: string;
  readonly owner: string;
}

/** The contract view of a record (no owner). */
export const imageView = ({ name, digest, methods, createdAt }: ImageRecord) => ({
  name,
  digest,
  methods: [...methods],
  createdAt,
});

export const digestOf = (module: Uint8Array): string => `sha256:${createHash("sha256").update(module).digest("hex")}`;

const hexOf = (digest: string) => digest.slice("sha256:".length);
const ownerKey = (owner: string) => nameToken(owner);
/** Objects are not shared between names, so deleting a name never races another name's push. */
const objectPrefix = (owner: string, name: string) => `${ownerKey(owner)}/${name}/`;
const objectName = ({ owner, name, digest }: Pick<ImageRecord, "owner" | "name" | "digest">) =>
  `${objectPrefix(owner, name)}${hexOf(digest)}`;
const latestKey = (owner: string, name: string) => `${ownerKey(owner)}.latest.${name}`;
const versionKey = (owner: string, name: string, digest: string) => `${ownerKey(owner)}.v.${name}.${hexOf(digest)}`;
const lockKey = (owner: string, name: string) => `${ownerKey(owner)}.lock.${name}`;
const usageKey = (owner: string) => `${ownerKey(owner)}.usage`;

/** A module on this host's disk, held in the cache until `release`. */
export interface HeldModule {
  readonly digest: string;
  readonly path: string;
  readonly release: () => void;
}

export interface ImageStoreOptions {
  /** JetStream replicas of the image buckets (default 1). */
  readonly replicas?: number;
  /** Bound of this host's module cache in MiB (`MICROVM_IMAGE_CACHE_MIB`, default 256). */
  readonly cacheMiB?: number;
  /** What one principal may store, every version of every name counted (429 past either). */
  readonly quota?: ImageQuota;
  /**
   * `max_bytes` of the object store of modules (`MICROVM_IMAGE_STORE_MIB`, default 1024 MiB) and
   * of the metadata bucket (a 64th of it, at least 1 MiB): JetStream refuses writes past them, so
   * images never take the space the task and job buckets need.
   */
  readonly storeMiB?: number;
}

export { DEFAULT_IMAGE_QUOTA, type ImageQuota } from "./quota.ts";
export const DEFAULT_IMAGE_STORE_MIB = 1024;

/** `name` or `name@sha256:<hex>`; undefined when it is neither. */
export function parseImageIdentifier(identifier: string): { name: string; digest?: string } | undefined {
  const match = /^([a-z0-9-]{1,64})(?:@(sha256:[0-9a-f]{64}))?$/.exec(identifier);
  if (!match) return undefined;
  return match[2] === undefined ? { name: match[1]! } : { name: match[1]!, digest: match[2] };
}

export class ImageStore {
  #jsm: Promise<JetStreamManager> | undefined;
  /** Each principal's pushes under way, reserved against its quota before they write. */
  readonly quota: QuotaReservations;

  private constructor(
    private readonly nc: NatsConnection,
    readonly kv: KV,
    private readonly objects: ObjectStore,
    /** This host's modules, one `<hex>.mjs` per digest. */
    readonly modules: ModuleCache,
    quota: ImageQuota,
  ) {
    this.quota = new QuotaReservations(kv, imageQuotaCheck(quota), usageKey, (owner) =>
      this.#objectsUnder(`${ownerKey(owner)}/`),
    );
  }

  /** Creates the image buckets, or brings existing ones to these limits (the provisioning credential's work). */
  static async provision(nc: NatsConnection, options: Pick<ImageStoreOptions, "replicas" | "storeMiB"> = {}) {
    const replicas = options.replicas ?? 1;
    const storeBytes = (options.storeMiB ?? DEFAULT_IMAGE_STORE_MIB) * 1024 * 1024;
    const metaBytes = Math.max(1024 * 1024, Math.floor(storeBytes / 64));
    await new Kvm(nc).create(bucketNames.images, { history: 1, replicas, allow_direct: true, max_bytes: metaBytes });
    await new Objm(nc).create(imageObjectBucket, { replicas, max_bytes: storeBytes });
    // `create` binds to buckets as they are: ones made before these limits get them now, and
    // direct gets (how modules are read) where they are off.
    await ensureStreamSettings(nc, `KV_${bucketNames.images}`, { max_bytes: metaBytes });
    await ensureStreamSettings(nc, `OBJ_${imageObjectBucket}`, { max_bytes: storeBytes, allow_direct: true });
  }

  /** Opens the image buckets as they are; `cacheDir` holds this host's module cache. */
  static async open(nc: NatsConnection, cacheDir: string, options: ImageStoreOptions = {}): Promise<ImageStore> {
    const { images: kv } = await openBuckets(nc, { only: ["images"] });
    await provisionedStream(nc, `OBJ_${imageObjectBucket}`);
    const objects = await new Objm(nc).open(imageObjectBucket, false);
    await mkdir(cacheDir, { recursive: true, mode: 0o700 });
    const modules = await ModuleCache.open(cacheDir, (options.cacheMiB ?? DEFAULT_IMAGE_CACHE_MIB) * 1024 * 1024);
    return new ImageStore(nc, kv, objects, modules, options.quota ?? DEFAULT_IMAGE_QUOTA);
  }

  /** Writes a module into the cache under its own digest, held (before it is checked or stored). */
  async stage(module: Uint8Array): Promise<HeldModule> {
    const digest = digestOf(module);
    const release = this.modules.pin(digest);
    try {
      await this.#write(digest, module);
    } catch (err) {
      release();
      throw err;
    }
    return { digest, path: this.modules.path(digest), release };
  }

  /**
   * Stores the module and makes `record` the latest version of its name, under the name's
   * lock: the object first, so a record always names a stored module.
   */
  async register(record: ImageRecord, module: Uint8Array): Promise<ImageRecord> {
    return withNameLock(this.kv, lockKey(record.owner, record.name), "push", async () => {
      const name = objectName(record);
      const stored = await this.objects.info(name);
      if (!stored || stored.deleted) {
        const put = () => this.objects.putBlob({ name }, module);
        if (record.owner === BUILTIN_OWNER) await put();
        else
          await this.quota.within(record.owner, name, module.byteLength, put, () =>
            this.objects.delete(name).then(() => undefined),
          );
      }
      const existing = await this.readKey(versionKey(record.owner, record.name, record.digest));
      // The same module pushed again keeps its first registration time.
      const kept = existing ?? record;
      if (!existing) await this.kv.put(versionKey(record.owner, record.name, record.digest), JSON.stringify(kept));
      await this.kv.put(latestKey(record.owner, record.name), JSON.stringify(kept));
      return kept;
    });
  }

  /**
   * Whether `record` may still be launched: once no delete of its name is under way, its
   * version is still stored. A launch asks after writing its instance record, and a delete
   * looks for live instances after taking the lock: a delete that began first either saw the
   * record (refused, the version stays) or removed the version before the launch reads it.
   */
  async launchable(record: ImageRecord): Promise<boolean> {
    await afterDelete(this.kv, lockKey(record.owner, record.name));
    return (await this.readKey(versionKey(record.owner, record.name, record.digest))) !== undefined;
  }

  /** The latest version of `name` that `principal` sees: its own, else a built-in one. */
  async latest(principal: string, name: string): Promise<ImageRecord | undefined> {
    return (await this.readKey(latestKey(principal, name))) ?? (await this.readKey(latestKey(BUILTIN_OWNER, name)));
  }

  /** A version of `name` that `principal` sees. */
  async version(principal: string, name: string, digest: string): Promise<ImageRecord | undefined> {
    return (
      (await this.readKey(versionKey(principal, name, digest))) ??
      (await this.readKey(versionKey(BUILTIN_OWNER, name, digest)))
    );
  }

  /** The latest versions `principal` sees: its own and the built-in ones it has not shadowed. */
  async list(principal: string): Promise<ImageRecord[]> {
    const own = await this.readAll(`${ownerKey(principal)}.latest.>`);
    const builtin = principal === BUILTIN_OWNER ? [] : await this.readAll(`${ownerKey(BUILTIN_OWNER)}.latest.>`);
    const names = new Set(own.map((record) => record.name));
    return [...own, ...builtin.filter((record) => !names.has(record.name))].sort((a, b) =>
      a.name.localeCompare(b.name),
    );
  }

  /**
   * Removes `owner`'s `name`, its versions and its objects (those of a push that died
   * half-way too), under the name's lock, once `assertUnused` has resolved (it throws to refuse).
   */
  async delete(owner: string, name: string, assertUnused: () => Promise<void>): Promise<void> {
    await withNameLock(this.kv, lockKey(owner, name), "delete", async () => {
      await assertUnused();
      const versions = await this.subjectsOf(`${ownerKey(owner)}.v.${name}.*`);
      await this.kv.purge(latestKey(owner, name));
      for (const key of versions) await this.kv.purge(key);
      for (const object of await this.objectsOf(owner, name)) await this.objects.delete(object);
    });
  }

  /** Names of the stored objects of `owner`'s `name`. */
  async objectsOf(owner: string, name: string): Promise<string[]> {
    return (await this.#objectsUnder(objectPrefix(owner, name))).map((object) => object.name);
  }

  async #objectsUnder(prefix: string) {
    return listObjects(await this.#manager(), this.objects, imageObjectBucket, prefix);
  }

  #manager(): Promise<JetStreamManager> {
    return (this.#jsm ??= jetstreamManager(this.nc));
  }

  /** Whether the module of `record` is in the object store. */
  async stored(record: ImageRecord): Promise<boolean> {
    const info = await this.objects.info(objectName(record));
    return info !== null && !info.deleted;
  }

  /**
   * The module of `record` on this host's disk, held in the cache until released: from the
   * cache, else fetched from the object store and checked against its digest first.
   * Resolves undefined when the object store no longer has it (the image was deleted).
   */
  async fetch(record: ImageRecord): Promise<HeldModule | undefined> {
    const { digest } = record;
    const release = this.modules.pin(digest);
    const path = this.modules.path(digest);
    try {
      const cached = this.modules.has(digest) ? await readFile(path).catch(() => undefined) : undefined;
      if (cached && digestOf(cached) === digest) {
        this.modules.touch(digest);
        return { digest, path, release };
      }
      const module = await readObject(await this.#manager(), this.objects, objectName(record), MAX_IMAGE_MODULE_BYTES);
      if (!module) {
        release();
        return undefined;
      }
      const actual = digestOf(module);
      if (actual !== digest) throw new Error(`image module ${digest} arrived with digest ${actual}`);
      await this.#write(digest, module);
      return { digest, path, release };
    } catch (err) {
      release();
      throw err;
    }
  }

  async #write(digest: string, module: Uint8Array): Promise<void> {
    await writeAtomically(this.modules.path(digest), module);
    this.modules.added(digest, module.byteLength);
  }

  /** The record at `key`; one not of the shape this code writes counts as absent. */
  private async readKey(key: string): Promise<ImageRecord | undefined> {
    const entry = await this.kv.get(key);
    if (entry?.operation !== "PUT" || entry.length === 0) return undefined;
    let record: Partial<ImageRecord> | undefined;
    try {
      record = entry.json<Partial<ImageRecord>>();
    } catch {
      record = undefined;
    }
    const wellFormed =
      typeof record === "object" &&
      record !== null &&
      typeof record.name === "string" &&
      typeof record.digest === "string" &&
      typeof record.owner === "string" &&
      typeof record.createdAt === "string" &&
      Array.isArray(record.methods);
    if (wellFormed) return record as ImageRecord;
    log.warn({ bucket: bucketNames.images, key }, "image record of the wrong shape ignored");
    return undefined;
  }

  private async readAll(filter: string): Promise<ImageRecord[]> {
    const keys = await this.subjectsOf(filter);
    const records = await Promise.all(keys.map((key) => this.readKey(key)));
    return records.filter((record): record is ImageRecord => record !== undefined);
  }

  /** Keys holding a message that match `filter`, from the stream's per-subject counts. */
  private async subjectsOf(filter: string): Promise<string[]> {
    const jsm = await this.#manager();
    const prefix = `$KV.${bucketNames.images}.`;
    const info = await jsm.streams.info(`KV_${bucketNames.images}`, { subjects_filter: `${prefix}${filter}` });
    return Object.keys(info.state.subjects ?? {}).map((subject) => subject.slice(prefix.length));
  }
}

async function writeAtomically(path: string, data: Uint8Array): Promise<void> {
  const temporary = `${path}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
  await writeFile(temporary, data, { mode: 0o600 });
  await rename(temporary, path);
}

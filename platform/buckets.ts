// The JetStream KV buckets the actors persist in: made or brought up to date at start by the
// provisioning step (`provisionBuckets`), opened as they are by the running roles (`openBuckets`).
import {
  JetStreamApiCodes,
  JetStreamApiError,
  jetstreamManager,
  type Republish,
  type StreamConfig,
  type StreamInfo,
} from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { recordStore, type RecordStore } from "./record-store.ts";
import { indexStreamConfig, recordIndex, type RecordIndex } from "./record-index.ts";
import type { Requester } from "./requester.ts";
import { tracedMethods } from "./tracing.ts";
import { versionedStore, type VersionedStore } from "./lease-store.ts";
import { KEY_REVOCATIONS_BUCKET, REVOCATION_KEEP_MS } from "./key-revocations.ts";

/** Bucket names; a record's last revision is all that is read, so one revision of history is enough. */
export const bucketNames = {
  tasks: "tasks",
  taskObjects: "taskobjects",
  jobs: "jobs",
  microvms: "microvms",
  /** Image metadata (owner, name, digest, methods); the modules live in the object store `images`. */
  images: "images",
  /** Task-object leases on replicated buckets (`leaseBucketFor`): which process holds each name. */
  taskObjectLeases: "taskobject-leases",
  /** API keys removed from a gateway's key file, for the microVM hosts (`key-revocations.ts`). */
  keyRevocations: KEY_REVOCATIONS_BUCKET,
} as const;

/**
 * The bucket of task-object leases (one key `<name-token>` per name). On one replica it is
 * `taskobjects` itself, beside the name's records `<name-token>.<id>`, so a record's write can be
 * conditional on its lease's revision (a condition on another key of the same stream). Replicated
 * buckets do not fold fences that way (`foldsFences`), and keep leases in a stream of their own,
 * whose Raft group leads, fails over and takes its heartbeats apart from the records'.
 */
export function leaseBucketFor(replicas = 1): string {
  return replicas > 1 ? bucketNames.taskObjectLeases : bucketNames.taskObjects;
}

export type Buckets = { readonly [K in keyof typeof bucketNames]: KV };

export interface BucketOptions {
  /** JetStream replicas per bucket (3 on a 3-node cluster). */
  replicas?: number;
  /** The operations' subject prefix (`NATS_SUBJECT_PREFIX`): the jobs feed is below it. */
  prefix?: string;
}

/**
 * The core subject below which the server republishes every write of the jobs bucket as it
 * stores it (`<this>.<key>`, headers `Nats-Sequence`, `KV-Operation`): the job-created feed. A
 * watcher subscribes to it and needs no consumer of its own, so no user but the service's
 * roles may create consumers (a push consumer's deliver subject is not visible to permissions).
 */
export const jobsCreatedSubject = (prefix = "") => (prefix ? `${prefix}.jobs.created` : "jobs.created");

/**
 * The core subject below which the server republishes every write of the tasks and task-object
 * buckets as it stores it, headers only (`<this>.<bucket>.<key>`, header `Nats-Sequence`: the
 * revision): the feed from which gateways drop the read answers they keep.
 */
export const recordChangesSubject = (prefix = "") => (prefix ? `${prefix}.records.changed` : "records.changed");

/** The buckets whose writes `recordChangesSubject` carries. */
const changeFedBuckets: readonly BucketName[] = ["tasks", "taskObjects"];
/** The names of the buckets whose writes `recordChangesSubject` carries. */
export const changeFedBucketNames: readonly string[] = changeFedBuckets.map((key) => bucketNames[key]);

export type BucketName = keyof typeof bucketNames;

/** The JetStream Object Store bucket of image modules, one object per digest. */
export const imageObjectBucket = "images";

/** The JetStream Object Store bucket of suspended instances' snapshots, one object per owner and instance. */
export const snapshotObjectBucket = "snapshots";

/** The stream of instances' output lines, one subject per owner and instance below `instanceLogSubjects`. */
export const instanceLogStream = "MICROVM_LOGS";
export const instanceLogSubjects = "microvmlogs.>";

/** The buckets the task, task-object and job actors own (the microVM host owns `microvms` and `images`). */
export const actorBuckets = [
  "tasks",
  "taskObjects",
  "jobs",
  "taskObjectLeases",
] as const satisfies readonly BucketName[];

/**
 * Creates the buckets named in `only` (default: every bucket), or brings ones that exist to
 * these settings. Direct get lets any replica answer reads. Needs the provisioning credential:
 * no running role may create or update a stream.
 */
export async function provisionBuckets<K extends BucketName = BucketName>(
  nc: NatsConnection,
  options: BucketOptions & { only?: readonly K[] } = {},
): Promise<Pick<Buckets, K>> {
  const kvm = new Kvm(nc);
  const provision = async (key: BucketName) => {
    const name = bucketNames[key];
    const settings = republishOf(key, options.prefix);
    // Revocations outlive every token they refuse, and no longer.
    const ttl = key === "keyRevocations" ? { ttl: REVOCATION_KEEP_MS } : {};
    const kv = await kvm.create(name, {
      history: 1,
      replicas: options.replicas ?? 1,
      allow_direct: true,
      ...ttl,
      ...settings,
    });
    // `create` binds to a bucket that exists as it is: one made before these settings gets them now.
    if (settings.republish) await ensureStreamSettings(nc, `KV_${name}`, settings);
    if (indexedBuckets.includes(key)) await provisionIndexStream(nc, name, options.replicas);
    return kv;
  };
  return eachBucket(options.only, provision);
}

/**
 * Opens the buckets named in `only` (default: every bucket) as they are: a stream info each
 * (`StoreNotProvisioned` when one is missing), never a create or an update.
 */
export async function openBuckets<K extends BucketName = BucketName>(
  nc: NatsConnection,
  options: { only?: readonly K[] } = {},
): Promise<Pick<Buckets, K>> {
  const kvm = new Kvm(nc);
  const open = async (key: BucketName) => {
    const name = bucketNames[key];
    const { config } = await provisionedStream(nc, `KV_${name}`);
    return kvm.open(name, { allow_direct: config.allow_direct === true });
  };
  return eachBucket(options.only, open);
}

async function eachBucket<K extends BucketName>(
  only: readonly K[] | undefined,
  open: (key: BucketName) => Promise<KV>,
): Promise<Pick<Buckets, K>> {
  const wanted = only ?? (Object.keys(bucketNames) as K[]);
  const entries = await Promise.all(wanted.map(async (key) => [key, await open(key)] as const));
  return Object.fromEntries(entries) as unknown as Pick<Buckets, K>;
}

/** A stream the service needs does not exist: no provisioning step has made it on this NATS. */
export class StoreNotProvisioned extends Error {
  override name = "StoreNotProvisioned";
}

/** The info of `stream`, which must exist: a running role opens its stores, never makes them. */
export async function provisionedStream(nc: NatsConnection, stream: string): Promise<StreamInfo> {
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  try {
    return await jsm.streams.info(stream);
  } catch (err) {
    if (!(err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound)) throw err;
    throw new StoreNotProvisioned(
      `the stream ${stream} does not exist: the stores are made at start with the provisioning credential ` +
        `(docs/security.md#provisioning)`,
      { cause: err },
    );
  }
}

/** The buckets whose lists are read a page at a time from an index stream (record-index.ts). */
export const indexedBuckets: readonly BucketName[] = ["tasks", "taskObjects"];

/** Creates the index stream of `bucket` (one that exists with these settings is kept as it is). */
async function provisionIndexStream(nc: NatsConnection, bucket: string, replicas?: number): Promise<void> {
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  await jsm.streams.add(indexStreamConfig(bucket, replicas));
}

/**
 * Where the server republishes a bucket's writes: jobs whole, tasks and task objects headers
 * only. Of task objects only the records (`<name-token>.<id>`), not the leases beside them.
 */
function republishOf(key: BucketName, prefix: string | undefined): { republish?: Republish } {
  const src = `$KV.${bucketNames[key]}.>`;
  if (key === "jobs") return { republish: { src, dest: `${jobsCreatedSubject(prefix)}.>` } };
  if (!changeFedBuckets.includes(key)) return {};
  const dest = `${recordChangesSubject(prefix)}.${bucketNames[key]}`;
  if (key === "taskObjects") {
    return {
      republish: {
        src: `$KV.${bucketNames[key]}.*.*`,
        dest: `${dest}.{{wildcard(1)}}.{{wildcard(2)}}`,
        headers_only: true,
      },
    };
  }
  return { republish: { src, dest: `${dest}.>`, headers_only: true } };
}

/** Updates `stream` where its config differs from `settings` (compared as JSON). */
export async function ensureStreamSettings(
  nc: NatsConnection,
  stream: string,
  settings: Partial<StreamConfig>,
): Promise<void> {
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  const { config } = await jsm.streams.info(stream);
  const differs = Object.entries(settings).some(
    ([field, value]) => JSON.stringify(config[field as keyof StreamConfig]) !== JSON.stringify(value),
  );
  if (differs) await jsm.streams.update(stream, { ...config, ...settings });
}

/** The record buckets served by the task, task-object and job actors. */
export type RecordStores = {
  readonly tasks: RecordStore;
  readonly taskObjects: RecordStore;
  readonly jobs: RecordStore;
  /** Task-object leases (placement), read and written with revision checks. */
  readonly taskObjectLeases: VersionedStore;
  /** The index streams of `tasks` and `taskobjects`: their lists, page by page. */
  readonly taskIndex: RecordIndex;
  readonly taskObjectIndex: RecordIndex;
};

/** Lean stores over the record buckets (made first by `provisionBuckets`). */
export function recordStores(requester: Requester, options: BucketOptions = {}): RecordStores {
  const open = (name: string) =>
    tracedMethods(recordStore(requester, name, { replicas: options.replicas }), `kv ${name}`);
  return {
    tasks: open(bucketNames.tasks),
    taskObjects: open(bucketNames.taskObjects),
    jobs: open(bucketNames.jobs),
    taskObjectLeases: tracedMethods(versionedStore(requester, leaseBucketFor(options.replicas)), "lease"),
    taskIndex: tracedMethods(recordIndex(requester, bucketNames.tasks), `index ${bucketNames.tasks}`),
    taskObjectIndex: tracedMethods(recordIndex(requester, bucketNames.taskObjects), `index ${bucketNames.taskObjects}`),
  };
}

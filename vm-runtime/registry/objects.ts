// Reading the image object store with no consumer: nats.js v3's object reads (get, list) are
// push consumers, and a right to create those would let a role name any deliver subject. An
// object's meta comes from the stream leader, its chunks by direct gets checked against the
// meta's size, chunk count and SHA-256 as nats.js checks them; objects are listed from the
// stream's per-subject counts. The stored format is nats.js's own: either side reads the other's.
import { createHash } from "node:crypto";
import type { JetStreamManager, StoredMsg } from "@nats-io/jetstream";
import type { ObjectInfo, ObjectStore } from "@nats-io/obj";

/** An object of the store that is not deleted. */
export interface ListedObject {
  readonly name: string;
  readonly size: number;
}

/** An object whose chunks do not add up to its meta: never handed out. */
export class CorruptObject extends Error {
  override readonly name = "CorruptObject";
}

const DIGEST_TYPE = "SHA-256=";

/**
 * The bytes of object `name`, or undefined when it is absent or deleted (also when it is
 * deleted or replaced while being read). Refuses objects larger than `maxBytes` before reading.
 */
export async function readObject(
  jsm: JetStreamManager,
  objects: ObjectStore,
  name: string,
  maxBytes: number,
): Promise<Uint8Array | undefined> {
  const opened = await openObject(jsm, objects, name, maxBytes);
  if (!opened) return undefined;
  const chunks: Uint8Array[] = [];
  try {
    for await (const chunk of opened.chunks) chunks.push(chunk);
  } catch (err) {
    if (err instanceof ObjectReplaced) return undefined;
    throw err;
  }
  return Buffer.concat(chunks);
}

/** The object was deleted or written again while it was read. */
export class ObjectReplaced extends Error {
  override readonly name = "ObjectReplaced";
}

/** An object being read: its size, and its chunks as they are fetched (one ahead). */
export interface OpenedObject {
  readonly size: number;
  /** The SHA-256 its meta names (its chunks are checked against it as they are read). */
  readonly sha256: Buffer;
  /**
   * Its chunks in order; throws `CorruptObject` when they do not add up to its meta (the digest
   * is checked once the last is fetched, before it is yielded) and `ObjectReplaced` when it
   * was deleted or written again meanwhile.
   */
  readonly chunks: AsyncIterable<Uint8Array>;
}

/**
 * Object `name` to read chunk by chunk, or undefined when it is absent or deleted. Refuses
 * objects larger than `maxBytes` before reading.
 */
export async function openObject(
  jsm: JetStreamManager,
  objects: ObjectStore,
  name: string,
  maxBytes: number,
): Promise<OpenedObject | undefined> {
  const info = await objects.info(name);
  if (!info || info.deleted) return undefined;
  if (info.options?.link) throw new CorruptObject(`object ${name} is a link`);
  const expected = parseDigest(info.digest);
  if (!expected) throw new CorruptObject(`object ${name} has no SHA-256 digest`);
  if (info.size > maxBytes) throw new CorruptObject(`object ${name} has ${info.size} bytes, more than ${maxBytes}`);
  return { size: info.size, sha256: expected, chunks: chunksOf(jsm, objects, info, expected) };
}

async function* chunksOf(
  jsm: JetStreamManager,
  objects: ObjectStore,
  info: ObjectInfo,
  expected: Buffer,
): AsyncGenerator<Uint8Array> {
  const { name } = info;
  const stream = `OBJ_${info.bucket}`;
  const subject = `$O.${info.bucket}.C.${info.nuid}`;
  const hash = createHash("sha256");
  let bytes = 0;
  const fetch = (seq: number) => chunkFrom(jsm, stream, subject, seq);
  let next = info.chunks > 0 ? fetch(1) : undefined;
  for (let n = 0; n < info.chunks; n++) {
    const chunk = await next!;
    if (!chunk) {
      if (await replaced(objects, info)) throw new ObjectReplaced(`object ${name} was replaced while it was read`);
      throw new CorruptObject(`object ${name} lacks chunk ${n + 1} of ${info.chunks}`);
    }
    // Chunks are stored before their meta; a later one belongs to another write.
    if (chunk.seq >= info.revision) throw new CorruptObject(`object ${name} has a chunk after its meta`);
    // The next chunk is on its way while this one is used: one ahead, never more.
    next = n + 1 < info.chunks ? fetch(chunk.seq + 1) : undefined;
    next?.catch(() => undefined);
    bytes += chunk.data.byteLength;
    if (bytes > info.size) throw new CorruptObject(`object ${name} has more than its ${info.size} bytes`);
    hash.update(chunk.data);
    if (n + 1 === info.chunks) {
      if (bytes !== info.size) throw new CorruptObject(`object ${name} has ${bytes} of its ${info.size} bytes`);
      if (!hash.digest().equals(expected)) throw new CorruptObject(`object ${name} does not match its digest`);
    }
    yield chunk.data;
  }
  if (info.chunks === 0 && info.size !== 0) throw new CorruptObject(`object ${name} has 0 of its ${info.size} bytes`);
}

/** The objects whose names start with `prefix` (not deleted), with their sizes. */
export async function listObjects(
  jsm: JetStreamManager,
  objects: ObjectStore,
  bucket: string,
  prefix: string,
): Promise<ListedObject[]> {
  const metaPrefix = `$O.${bucket}.M.`;
  const info = await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `${metaPrefix}>` });
  const names = Object.keys(info.state.subjects ?? {})
    .map((subject) => Buffer.from(subject.slice(metaPrefix.length), "base64url").toString("utf8"))
    .filter((name) => name.startsWith(prefix));
  const infos = await Promise.all(names.map((name) => objects.info(name)));
  return infos
    .filter((entry): entry is ObjectInfo => entry !== null && !entry.deleted)
    .map(({ name, size }) => ({ name, size }));
}

/**
 * The first message on `subject` at or after `seq`: a direct get, which any replica may
 * answer; one that has not applied the write yet answers 404, so a miss asks the leader.
 */
async function chunkFrom(jsm: JetStreamManager, stream: string, subject: string, seq: number) {
  const query = { seq, next_by_subj: subject };
  const direct = await jsm.direct.getMessage(stream, query);
  // The stream message get takes `next_by_subj` too (nats.js types only the other two forms).
  const msg: StoredMsg | null = direct ?? (await jsm.streams.getMessage(stream, query as unknown as { seq: number }));
  return msg && msg.subject === subject ? msg : undefined;
}

/** Whether the object was deleted or written again since `info` was read. */
async function replaced(objects: ObjectStore, info: ObjectInfo): Promise<boolean> {
  const now = await objects.info(info.name);
  return !now || now.deleted || now.nuid !== info.nuid;
}

/** The 32 bytes of a `SHA-256=` digest, in base64 (URL-safe or not) or hex, as nats.js accepts. */
export function parseDigest(digest: string): Buffer | undefined {
  if (!digest.startsWith(DIGEST_TYPE)) return undefined;
  const value = digest.slice(DIGEST_TYPE.length);
  const bytes = /^[0-9a-f]{64}$/i.test(value)
    ? Buffer.from(value, "hex")
    : Buffer.from(value.replace(/-/g, "+").replace(/_/g, "/"), "base64");
  return bytes.byteLength === 32 ? bytes : undefined;
}

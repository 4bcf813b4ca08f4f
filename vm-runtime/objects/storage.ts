// Object storage, host side (`ctx.storage`): JSON values under string keys in the objects bucket,
// every write fenced by the activation's lease (a condition on the lease key's revision, checked
// by the server), bytes counted per principal against a quota, lists read a page per request.
import { headers, type MsgHdrs } from "@nats-io/transport-node";
import {
  directGets,
  isWrongLastSequence,
  JetStreamRequestError,
  OBJECTS_BUCKET,
  type Requester,
} from "../../platform/index.ts";
import { invalidKey, superseded } from "./errors.ts";
import { bucketSubject, objectKey, storageKey, type ObjectRef } from "./keys.ts";
import { isDeletion, readPage } from "./pages.ts";
import { storageUsage, type StorageUsage } from "./usage.ts";

import { checkedKey, valueJson } from "./values.ts";

export { MAX_STORAGE_KEY_BYTES, MAX_STORAGE_VALUE_BYTES } from "./values.ts";
/** Default storage quota of one principal (all its objects), in bytes. */
export const DEFAULT_QUOTA_BYTES = 256 * 1024 * 1024;
/** Entries of one list page: default and most. */
export const DEFAULT_LIST_LIMIT = 100;
export const MAX_LIST_LIMIT = 1_000;

/** A write's fencing token: the object's lease key and the revision its activation holds. */
export interface FencingToken {
  readonly leaseKey: string;
  readonly revision: number;
}

/**
 * The activation whose writes storage fences, as placement supplies it (`carryingFence` and
 * `fence` of an activation).
 */
export interface ActivationFence {
  /** The token to carry now, once no write of the lease is in flight; throws when the activation ended. */
  token(): FencingToken | Promise<FencingToken>;
  /**
   * After a write refused on its token: renews the lease at the revision held (a renewal had
   * moved it), or throws when another activation holds the object now.
   */
  renew(): Promise<void>;
}

/** One stored key and its value. */
export interface StorageEntry {
  readonly key: string;
  readonly value: unknown;
}

export interface ListOptions {
  /** Only keys starting with this. */
  readonly prefix?: string;
  /** Entries at most (default 100, at most 1000). */
  readonly limit?: number;
  /** Where the previous page ended. */
  readonly cursor?: string;
}

/** A page of entries, in the order they were last written; `cursor` when more may follow. */
export interface StoragePage {
  readonly items: StorageEntry[];
  readonly cursor?: string;
}

/** `ctx.storage` of one activation. */
export interface ObjectStorage {
  get(key: string): Promise<unknown>;
  /** Durable when it resolves (the server acked the write). */
  put(key: string, value: unknown): Promise<void>;
  /** True when the key held a value. */
  delete(key: string): Promise<boolean>;
  list(options?: ListOptions): Promise<StoragePage>;
}

export interface StorageOptions {
  /** Bytes all objects of one principal may store (keys and values). */
  quotaBytes?: number;
  timeoutMs?: number;
}

/** The storage of every object, for one host. */
export interface ObjectStores {
  /** `object`'s storage, written under `fence`. */
  open(object: ObjectRef, fence: ActivationFence): ObjectStorage;
  /** Removes one page of `object`'s keys (deleting it); true when none is left. */
  purgePage(object: ObjectRef, pageSize?: number): Promise<boolean>;
  readonly usage: StorageUsage;
}

interface JsAck {
  seq?: number;
  error?: { code: number; err_code: number; description: string };
}

/** Sizes an activation knows of its own keys (it is their only writer while it lives). */
const KNOWN_SIZES = 10_000;

export function objectStores(requester: Requester, options: StorageOptions = {}): ObjectStores {
  const timeout = options.timeoutMs ?? 5_000;
  const stream = `KV_${OBJECTS_BUCKET}`;
  const directGet = directGets(requester, stream, timeout);
  const usage = storageUsage(requester, options.quotaBytes ?? DEFAULT_QUOTA_BYTES, timeout);

  const read = async (subject: string): Promise<Uint8Array | undefined> => {
    const msg = await directGet(subject);
    return msg && !isDeletion(msg.headers) ? msg.data : undefined;
  };

  const send = async (subject: string, data: Uint8Array | string, h: MsgHdrs): Promise<JsAck> =>
    (await requester.request(subject, data, timeout, h)).json<JsAck>();

  /** Sends a write carrying the fence; on a refusal renews once and tries again, else superseded. */
  const fenced = async (
    object: string,
    fence: ActivationFence,
    subject: string,
    data: Uint8Array | string,
    marker: boolean,
  ) => {
    for (let attempt = 0; ; attempt++) {
      const token = await Promise.resolve(fence.token()).catch((err: unknown) => {
        throw superseded(object, { cause: err });
      });
      const ack = await send(subject, data, fenceHeaders(token, marker));
      if (!isWrongLastSequence(ack.error?.err_code)) return checked(ack);
      if (attempt > 0) throw superseded(object);
      await fence.renew().catch((err: unknown) => {
        throw superseded(object, { cause: err });
      });
    }
  };

  const open = (object: ObjectRef, fence: ActivationFence): ObjectStorage => {
    const key = objectKey(object);
    const sizes = new Map<string, number>();
    const sizeOf = async (subject: string): Promise<number> => {
      const known = sizes.get(subject);
      if (known !== undefined) return known;
      const data = await read(subject);
      return data ? storedSize(subject, data.length) : 0;
    };
    const remember = (subject: string, size: number) => {
      if (sizes.size >= KNOWN_SIZES) sizes.clear();
      sizes.set(subject, size);
    };
    // One write at a time: a write's size change is counted against the size the previous left.
    let writes: Promise<unknown> = Promise.resolve();
    const serially = <T>(write: () => Promise<T>): Promise<T> => {
      const next = writes.then(write, write);
      writes = next.catch(() => undefined);
      return next;
    };
    return {
      async get(name) {
        const data = await read(bucketSubject(storageKey(key, checkedKey(name))));
        return data && JSON.parse(Buffer.from(data).toString("utf8"));
      },
      put: (name, value) =>
        serially(async () => {
          const subject = bucketSubject(storageKey(key, checkedKey(name)));
          const data = Buffer.from(valueJson(value), "utf8");
          const size = storedSize(subject, data.length);
          const delta = size - (await sizeOf(subject));
          await usage.change(object.principal, delta, () => fenced(key, fence, subject, data, false), key);
          remember(subject, size);
        }),
      delete: (name) =>
        serially(async () => {
          const subject = bucketSubject(storageKey(key, checkedKey(name)));
          const size = await sizeOf(subject);
          if (size === 0) return false;
          await usage.change(object.principal, -size, () => fenced(key, fence, subject, "", true), key);
          remember(subject, 0);
          return true;
        }),
      list: (options = {}) => listPage(requester, stream, key, options, timeout),
    };
  };

  const purgePage = async (object: ObjectRef, pageSize = 1_000): Promise<boolean> => {
    const key = objectKey(object);
    const page = await readPage(requester, stream, `${bucketSubject(key)}.*`, 0, pageSize, timeout);
    if (page.messages.length === 0) return true;
    const bytes = page.messages.reduce((sum, m) => sum + (m.deleted ? 0 : storedSize(m.subject, m.data.length)), 0);
    const last = page.messages.at(-1)!.seq;
    // Only the messages of this page: those below the next sequence, which the page walked.
    const reply = (
      await requester.request(
        `$JS.API.STREAM.PURGE.${stream}`,
        JSON.stringify({ filter: `${bucketSubject(key)}.*`, seq: last + 1 }),
        timeout,
      )
    ).json<{ success?: boolean; error?: JsAck["error"] }>();
    if (reply.error) throw new JetStreamRequestError(reply.error.code, reply.error.err_code, reply.error.description);
    if (bytes > 0) await usage.add(object.principal, -bytes, key);
    return page.pending === 0;
  };

  return { open, purgePage, usage };
}

/** Bytes a stored key counts for: its subject's key token and its value. */
function storedSize(subject: string, valueBytes: number): number {
  return subject.length - subject.lastIndexOf(".") - 1 + valueBytes;
}

function fenceHeaders(token: FencingToken, marker: boolean): MsgHdrs {
  const h = headers();
  h.set("Nats-Expected-Last-Subject-Sequence", String(token.revision));
  h.set("Nats-Expected-Last-Subject-Sequence-Subject", bucketSubject(token.leaseKey));
  if (marker) {
    h.set("KV-Operation", "DEL");
    // The marker goes by itself: a list skips it meanwhile.
    h.set("Nats-TTL", "1s");
  }
  return h;
}

function checked(ack: JsAck): number {
  if (ack.error || ack.seq === undefined)
    throw new JetStreamRequestError(
      ack.error?.code ?? 500,
      ack.error?.err_code ?? 0,
      ack.error?.description ?? "no sequence in ack",
    );
  return ack.seq;
}

async function listPage(
  requester: Requester,
  stream: string,
  object: string,
  options: ListOptions,
  timeout: number,
): Promise<StoragePage> {
  const limit = Math.max(1, Math.min(MAX_LIST_LIMIT, Math.floor(options.limit ?? DEFAULT_LIST_LIMIT)));
  const after = options.cursor === undefined ? 0 : Number(options.cursor);
  if (!Number.isSafeInteger(after) || after < 0) throw invalidKey(`"${options.cursor}" is no cursor of a list`);
  const page = await readPage(requester, stream, `${bucketSubject(object)}.*`, after, limit, timeout);
  const items: StorageEntry[] = [];
  for (const message of page.messages) {
    if (message.deleted) continue;
    const key = Buffer.from(message.subject.slice(message.subject.lastIndexOf(".") + 1), "base64url").toString("utf8");
    if (options.prefix !== undefined && !key.startsWith(options.prefix)) continue;
    items.push({ key, value: JSON.parse(Buffer.from(message.data).toString("utf8")) });
  }
  const last = page.messages.at(-1)?.seq;
  return page.pending > 0 && last !== undefined ? { items, cursor: String(last) } : { items };
}

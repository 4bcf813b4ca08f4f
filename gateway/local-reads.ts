// Reads served by the gateway itself from storage (one NATS round trip instead of two), for
// the operations whose contract declares `reads`, with the functions `main.ts` hands in. A
// found answer of an `immutable` or `versioned` read is kept in a bounded cache by URL and sent
// again without routing, decoding or a KV read; a `versioned` one only until a write of its
// record is seen (this gateway's own writes, and the bucket's change feed). With the feed's
// check (`feed: true`, change-feed.ts) it is sent only while a check that began less than
// `staleMs` ago found every write of its bucket seen; without it, for at most `staleMs` after
// it was read. A `mutable` read asks storage every time; a "not found" is never kept.
import { EventEmitter } from "node:events";
import { LRUCache } from "lru-cache";
import {
  ServiceUnavailable,
  type InputOf,
  type Operation,
  type StorageReadContext,
  type Answer,
  answerValue,
  StoredAnswer,
  type StorageReads,
  type SuccessOf,
} from "../schemas/index.ts";

/**
 * The longest a kept `versioned` answer is sent after it was read: the bound after which a write
 * acknowledged anywhere is seen through this gateway even if its change notice never arrives.
 */
export const READ_CACHE_STALE_MS = 1_000;

export interface LocalReadOptions<Api extends Record<string, Operation>> {
  /** The storage reads of `Api`'s operations, by name (only operations declaring `reads` have one). */
  reads: StorageReads<Api>;
  /** Most answers kept (default 50,000); 0 turns the cache off. */
  cacheEntries?: number;
  /** Most bytes kept (default 64 MiB). */
  cacheBytes?: number;
  /** How long a `versioned` answer may be kept (default `READ_CACHE_STALE_MS`). */
  staleMs?: number;
  /**
   * The change feed is checked (`confirmed`, `forget`): a `versioned` answer is kept until its
   * record is written and sent while its bucket was confirmed within `staleMs`, not by age.
   */
  feed?: boolean;
}

/** A read's answer: its JSON bytes and, when it is a stored record, its revision. */
export interface ReadAnswer {
  body: Uint8Array;
  revision?: number;
}

/**
 * A read run in the gateway for `principal`: resolves to the answer or throws like the actor.
 * `url`: the request's path and query, under which (and the principal) a found record is remembered.
 */
export type LocalRead = (input: Record<string, unknown>, url: string, principal: string) => Promise<ReadAnswer>;

/** A read answered before: its operation, JSON bytes and revision. */
export interface AnsweredRead extends ReadAnswer {
  op: Operation;
  /** The stored record it is (`<bucket>.<key>`). */
  record: string;
}

export interface LocalReads {
  /** The local read for `op`, when its contract declares `reads` and a storage read is given. */
  forOperation(op: Operation): LocalRead | undefined;
  /**
   * The answer a GET of `url` on `api` by `principal` found before and may still send. The same
   * URL decodes to the same input: it is sent as it is, to the same principal only.
   */
  recall(api: string, url: string, principal: string): AnsweredRead | undefined;
  /**
   * A write of `record` (`<bucket>.<key>`) at `revision` was acknowledged (here) or published
   * (the change feed): kept answers older than it are dropped, and a read that finds an older
   * revision (a replica behind) is read again, never answered.
   */
  written(record: string, revision: number): void;
  /** The newest revision of `record` seen written (kept for the most recently written records). */
  revisionSeen(record: string): number | undefined;
  /** Emits `"written"` (record, revision) once `written` has taken effect. */
  readonly events: EventEmitter;
  /**
   * Every write of `bucket` acknowledged before `checkedAt` (a `performance.now()` instant) has
   * been seen: its kept answers may be sent until `checkedAt + staleMs` (`feed` only).
   */
  confirmed(bucket: string, checkedAt: number): void;
  /** Writes of `bucket` may have gone unseen: its kept answers are dropped, reads in flight not kept. */
  forget(bucket: string): void;
}

type StorageRead = (input: InputOf<Operation>, context: StorageReadContext) => Promise<Answer<SuccessOf<Operation>>>;

/**
 * The longest a `versioned` answer is kept with the feed checked: past it, one read again from a
 * replica that served it while it had not applied a write older than the writes this gateway's
 * revision floors remember (`floors`) is not sent on.
 */
const FEED_KEPT_MS = 30_000;

/** Where an answer is kept: per API, principal (whose records it read) and URL. */
const cacheKeyOf = (api: string, principal: string, url: string) => `${api} ${principal} ${url}`;

/** The bucket of a record name (`<bucket>.<key>`). */
const bucketOf = (record: string) => record.slice(0, record.indexOf("."));

/** Reads of a record found older than a write this gateway saw: tried this often, this far apart. */
const BEHIND_ATTEMPTS = 10;
const BEHIND_PAUSE_MS = 20;

export function localReads<Api extends Record<string, Operation>>(options: LocalReadOptions<Api>): LocalReads {
  // Looked up by the operation's name; `StorageReads` typed each one for its operation.
  const reads = options.reads as Readonly<Record<string, StorageRead | undefined>>;
  const entries = options.cacheEntries ?? 50_000;
  const staleMs = options.staleMs ?? READ_CACHE_STALE_MS;
  // The cache keys that hold each record, to drop them when it is written.
  const byRecord = new Map<string, Set<string>>();
  const cache =
    entries > 0
      ? new LRUCache<string, AnsweredRead>({
          max: entries,
          maxSize: options.cacheBytes ?? 64 * 1024 * 1024,
          sizeCalculation: (value, key) => value.body.byteLength + key.length,
          dispose: (value, key) => {
            const keys = byRecord.get(value.record);
            keys?.delete(key);
            if (keys?.size === 0) byRecord.delete(value.record);
          },
        })
      : undefined;
  // The newest revision seen written per record: a read finding an older one is behind.
  const floors = new LRUCache<string, number>({ max: Math.max(entries, 10_000) });
  const events = new EventEmitter();
  // With the feed checked: when each bucket was last confirmed, and how many times a bucket was
  // forgotten (a read that began before a `forget` is not kept).
  const confirmedAt = new Map<string, number>();
  let forgotten = 0;
  /** Whether a kept `versioned` answer of `record` may be sent now (feed checked). */
  const current = (record: string) => performance.now() - (confirmedAt.get(bucketOf(record)) ?? -Infinity) < staleMs;

  const keep = (cacheKey: string, answer: AnsweredRead, startedAt: number) => {
    const versioned = answer.op.reads === "versioned";
    const ttl = !versioned ? undefined : options.feed ? FEED_KEPT_MS : staleMs - (performance.now() - startedAt);
    if (!cache || (ttl !== undefined && ttl < 1)) return;
    cache.set(cacheKey, answer, { ttl });
    let keys = byRecord.get(answer.record);
    if (!keys) byRecord.set(answer.record, (keys = new Set()));
    keys.add(cacheKey);
  };

  return {
    events,
    forOperation(op) {
      const read = op.reads && Object.hasOwn(reads, op.name) ? reads[op.name] : undefined;
      if (!read) return undefined;
      const kept = op.reads !== "mutable";
      return async (input, url, principal) => {
        const startedAt = performance.now();
        const generation = forgotten;
        for (let attempt = 1; ; attempt++) {
          const answer = await read(input, { principal });
          const stored = answer instanceof StoredAnswer ? answer.stored : undefined;
          const value = answerValue(answer);
          const record = stored && `${stored.bucket}.${stored.key}`;
          if (record && stored.revision < (floors.get(record) ?? 0)) {
            // A replica that has not applied a write this gateway saw acknowledged.
            if (attempt === BEHIND_ATTEMPTS) throw ServiceUnavailable.make({});
            await new Promise((r) => setTimeout(r, BEHIND_PAUSE_MS));
            continue;
          }
          const body = Buffer.from(JSON.stringify(value));
          if (kept && record && generation === forgotten)
            keep(cacheKeyOf(op.api, principal, url), { op, body, revision: stored.revision, record }, startedAt);
          return { body, revision: stored?.revision };
        }
      };
    },
    recall(api, url, principal) {
      const kept = cache?.get(cacheKeyOf(api, principal, url));
      return kept && options.feed && kept.op.reads === "versioned" && !current(kept.record) ? undefined : kept;
    },
    revisionSeen: (record) => floors.get(record),
    written(record, revision) {
      if (revision > (floors.get(record) ?? 0)) floors.set(record, revision);
      for (const key of [...(byRecord.get(record) ?? [])]) {
        if ((cache?.peek(key)?.revision ?? 0) < revision) cache?.delete(key);
      }
      events.emit("written", record, revision);
    },
    confirmed(bucket, checkedAt) {
      if (checkedAt > (confirmedAt.get(bucket) ?? -Infinity)) confirmedAt.set(bucket, checkedAt);
    },
    forget(bucket) {
      forgotten++;
      confirmedAt.delete(bucket);
      for (const [record, keys] of [...byRecord]) {
        if (bucketOf(record) === bucket) for (const key of [...keys]) cache?.delete(key);
      }
    },
  };
}

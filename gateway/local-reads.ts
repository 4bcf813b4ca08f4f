// Reads served by the gateway itself from storage (one NATS round trip instead of two), for
// the operations whose contract declares `reads`, with the functions `main.ts` hands in. An
// `immutable` read's found answer is kept in a bounded cache by URL and sent again without
// routing, decoding or a KV read: the record never changes, in any process. A `mutable` read
// asks storage every time; a "not found" is never kept.
import { LRUCache } from "lru-cache";
import type { InputOf, Operation, StorageReads, SuccessOf } from "../schemas/index.ts";

export interface LocalReadOptions<Api extends Record<string, Operation>> {
  /** The storage reads of `Api`'s operations, by name (only operations declaring `reads` have one). */
  reads: StorageReads<Api>;
  /** Most answers kept (default 50,000); 0 turns the cache off. */
  cacheEntries?: number;
  /** Most bytes kept (default 64 MiB). */
  cacheBytes?: number;
}

/**
 * A read run in the gateway: resolves to the answer's JSON bytes or throws like the actor.
 * `url`: the request's path and query, under which a found immutable record is remembered.
 */
export type LocalRead = (input: Record<string, unknown>, url: string) => Promise<Uint8Array>;

/** A read answered before: its operation and JSON bytes. */
export interface AnsweredRead {
  op: Operation;
  body: Uint8Array;
}

export interface LocalReads {
  /** The local read for `op`, when its contract declares `reads` and a storage read is given. */
  forOperation(op: Operation): LocalRead | undefined;
  /**
   * The answer a GET of `url` on `api` found before (immutable reads only). The same URL
   * decodes to the same input and the record never changes: it is sent as it is.
   */
  recall(api: string, url: string): AnsweredRead | undefined;
}

type StorageRead = (input: InputOf<Operation>, context: {}) => Promise<SuccessOf<Operation>>;

export function localReads<Api extends Record<string, Operation>>(options: LocalReadOptions<Api>): LocalReads {
  // Looked up by the operation's name; `StorageReads` typed each one for its operation.
  const reads = options.reads as Readonly<Record<string, StorageRead | undefined>>;
  const entries = options.cacheEntries ?? 50_000;
  const cache =
    entries > 0
      ? new LRUCache<string, AnsweredRead>({
          max: entries,
          maxSize: options.cacheBytes ?? 64 * 1024 * 1024,
          sizeCalculation: (value, key) => value.body.byteLength + key.length,
        })
      : undefined;
  return {
    forOperation(op) {
      const read = op.reads && Object.hasOwn(reads, op.name) ? reads[op.name] : undefined;
      if (!read) return undefined;
      const keep = op.reads === "immutable" ? cache : undefined;
      return async (input, url) => {
        const body = Buffer.from(JSON.stringify(await read(input, {})));
        keep?.set(`${op.api} ${url}`, { op, body });
        return body;
      };
    },
    recall: (api, url) => cache?.get(`${api} ${url}`),
  };
}

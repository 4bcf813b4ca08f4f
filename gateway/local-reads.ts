// Reads served by the gateway itself: the actors' own read handlers run here against KV
// (one NATS round trip instead of two), behind a bounded cache of positive answers.
// Records never change after creation, so a cached answer stays true in every process;
// a "not found" is never cached.
import { LRUCache } from "lru-cache";
import { operationHandlers, type Handler } from "../actors/index.ts";
import type { RecordStores } from "../platform/index.ts";
import type { Operation } from "../schemas/index.ts";

export interface LocalReadOptions {
  stores: RecordStores;
  /** Most answers kept (default 50,000); 0 turns the cache off. */
  cacheEntries?: number;
  /** Most bytes kept (default 64 MiB). */
  cacheBytes?: number;
}

/** A read run in the gateway: resolves to the answer's JSON bytes or throws like the actor. */
export type LocalRead = (input: Record<string, unknown>) => Promise<Uint8Array>;

export interface LocalReads {
  /** The local read for `op`, when it is a read the gateway can serve. */
  forOperation(op: Operation): LocalRead | undefined;
}

export function localReads(options: LocalReadOptions): LocalReads {
  const handlers = operationHandlers(options.stores) as unknown as Record<string, Handler<Operation>>;
  const entries = options.cacheEntries ?? 50_000;
  const cache =
    entries > 0
      ? new LRUCache<string, Uint8Array>({
          max: entries,
          maxSize: options.cacheBytes ?? 64 * 1024 * 1024,
          sizeCalculation: (value, key) => value.byteLength + key.length,
        })
      : undefined;
  return {
    forOperation(op) {
      const handler = handlers[op.name];
      if (op.http.method !== "GET" || !handler) return undefined;
      return async (input) => {
        const key = `${op.name}\0${JSON.stringify(input)}`;
        const hit = cache?.get(key);
        if (hit) return hit;
        const answer = Buffer.from(JSON.stringify(await handler(input as never, {})));
        cache?.set(key, answer);
        return answer;
      };
    },
  };
}

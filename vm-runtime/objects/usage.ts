// Storage bytes per principal, in a counter stream (`Nats-Incr`, nats-server 2.12+): a growth is
// reserved before its write (the counter answers the new total, so the quota check is the same
// request) and given back when the write fails; a shrink is counted after its write. A host that
// dies between the two leaves the count high, never low: the quota errs on the side of refusing.
// Beside it each object's own count (what the directory shows), added after the write.
import { headers } from "@nats-io/transport-node";
import { directGets, JetStreamRequestError, OBJECT_USAGE_STREAM, type Requester } from "../../platform/index.ts";
import { quotaExceeded } from "./errors.ts";
import { usageSubject } from "./keys.ts";

export interface StorageUsage {
  readonly quotaBytes: number;
  /** Bytes the principal's objects store. */
  bytes(principal: string): Promise<number>;
  /** Bytes one object stores (`object` its `objectKey`). */
  objectBytes(object: string): Promise<number>;
  /** Adds `delta` (negative: removes) to the principal's count, and to `object`'s when named; the principal's new total. */
  add(principal: string, delta: number, object?: string): Promise<number>;
  /**
   * Runs `write`, which changes the storage of the principal (and of `object`, its `objectKey`,
   * when named) by `delta` bytes: a growth beyond the quota is refused (`StorageQuotaExceeded`)
   * before anything is written.
   */
  change<T>(principal: string, delta: number, write: () => Promise<T>, object?: string): Promise<T>;
}

/** The counter of one object's bytes (`object` its `objectKey`), beside its principal's. */
export const objectUsageSubject = (object: string): string => `objusage.${object}`;

interface CounterAck {
  val?: string;
  error?: { code: number; err_code: number; description: string };
}

export function storageUsage(requester: Requester, quotaBytes: number, timeoutMs: number): StorageUsage {
  const directGet = directGets(requester, OBJECT_USAGE_STREAM, timeoutMs);
  const increment = async (subject: string, delta: number): Promise<number> => {
    const h = headers();
    h.set("Nats-Incr", delta >= 0 ? `+${delta}` : String(delta));
    const ack = (await requester.request(subject, undefined, timeoutMs, h)).json<CounterAck>();
    if (ack.error || ack.val === undefined)
      throw new JetStreamRequestError(
        ack.error?.code ?? 500,
        ack.error?.err_code ?? 0,
        ack.error?.description ?? "no counter value",
      );
    return Number(ack.val);
  };
  const counted = async (subject: string): Promise<number> => {
    const msg = await directGet(subject);
    return msg ? Number(msg.json<{ val?: string }>().val ?? 0) : 0;
  };
  const add = async (principal: string, delta: number, object?: string): Promise<number> => {
    const [total] = await Promise.all([
      increment(usageSubject(principal), delta),
      object === undefined ? undefined : increment(objectUsageSubject(object), delta),
    ]);
    return total;
  };
  const giveBack = (principal: string, delta: number) =>
    increment(usageSubject(principal), -delta).catch(() => undefined);
  return {
    quotaBytes,
    bytes: (principal) => counted(usageSubject(principal)),
    objectBytes: (object) => counted(objectUsageSubject(object)),
    add,
    async change(principal, delta, write, object) {
      if (delta <= 0) {
        const done = await write();
        if (delta < 0) await add(principal, delta, object);
        return done;
      }
      const total = await increment(usageSubject(principal), delta);
      if (total > quotaBytes) {
        await giveBack(principal, delta);
        throw quotaExceeded(principal, total - delta, quotaBytes, delta);
      }
      const done = await write().catch(async (err: unknown) => {
        await giveBack(principal, delta);
        throw err;
      });
      if (object !== undefined) await increment(objectUsageSubject(object), delta);
      return done;
    },
  };
}

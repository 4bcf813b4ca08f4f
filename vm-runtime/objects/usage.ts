// Storage bytes per principal, in a counter stream (`Nats-Incr`, nats-server 2.12+): a growth is
// reserved before its write (the counter answers the new total, so the quota check is the same
// request) and given back when the write fails; a shrink is counted after its write. A host that
// dies between the two leaves the count high, never low: the quota errs on the side of refusing.
import { headers } from "@nats-io/transport-node";
import { directGets, JetStreamRequestError, OBJECT_USAGE_STREAM, type Requester } from "../../platform/index.ts";
import { quotaExceeded } from "./errors.ts";
import { usageSubject } from "./keys.ts";

export interface StorageUsage {
  readonly quotaBytes: number;
  /** Bytes the principal's objects store. */
  bytes(principal: string): Promise<number>;
  /** Adds `delta` (negative: removes) to the principal's count; the new total. */
  add(principal: string, delta: number): Promise<number>;
  /**
   * Runs `write`, which changes the principal's storage by `delta` bytes: a growth beyond the
   * quota is refused (`StorageQuotaExceeded`) before anything is written.
   */
  change<T>(principal: string, delta: number, write: () => Promise<T>): Promise<T>;
}

interface CounterAck {
  val?: string;
  error?: { code: number; err_code: number; description: string };
}

export function storageUsage(requester: Requester, quotaBytes: number, timeoutMs: number): StorageUsage {
  const directGet = directGets(requester, OBJECT_USAGE_STREAM, timeoutMs);
  const add = async (principal: string, delta: number): Promise<number> => {
    const h = headers();
    h.set("Nats-Incr", delta >= 0 ? `+${delta}` : String(delta));
    const ack = (await requester.request(usageSubject(principal), undefined, timeoutMs, h)).json<CounterAck>();
    if (ack.error || ack.val === undefined)
      throw new JetStreamRequestError(
        ack.error?.code ?? 500,
        ack.error?.err_code ?? 0,
        ack.error?.description ?? "no counter value",
      );
    return Number(ack.val);
  };
  const giveBack = (principal: string, delta: number) => add(principal, -delta).catch(() => undefined);
  return {
    quotaBytes,
    async bytes(principal) {
      const msg = await directGet(usageSubject(principal));
      return msg ? Number(msg.json<{ val?: string }>().val ?? 0) : 0;
    },
    add,
    async change(principal, delta, write) {
      if (delta <= 0) {
        const done = await write();
        if (delta < 0) await add(principal, delta);
        return done;
      }
      const total = await add(principal, delta);
      if (total > quotaBytes) {
        await giveBack(principal, delta);
        throw quotaExceeded(principal, total - delta, quotaBytes, delta);
      }
      try {
        return await write();
      } catch (err) {
        await giveBack(principal, delta);
        throw err;
      }
    },
  };
}

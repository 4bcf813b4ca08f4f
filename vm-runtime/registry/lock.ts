// One writer at a time per image name, over every host: a KV key `<owner>.lock.<name>` taken
// with `create` (fails while held) and released with a revision-checked delete. A holder that
// died leaves a lock whose deadline passes; the next writer takes it over compare-and-set.
import { randomUUID } from "node:crypto";
import type { KV } from "@nats-io/kv";
import { ServiceUnavailable } from "../../schemas/index.ts";

/** What the holder does: a launch that sees a `delete` under way does not start. */
export type LockPurpose = "push" | "delete";

interface LockValue {
  readonly holder: string;
  readonly purpose: LockPurpose;
  /** Epoch ms after which another writer may take the lock over. */
  readonly until: number;
}

/** Longest a holder may keep the lock (a push's writes, a delete's scan and purge). */
const HOLD_MS = 15_000;
/** Longest a writer waits for the lock before answering 503. */
const WAIT_MS = 10_000;

export async function withNameLock<T>(kv: KV, key: string, purpose: LockPurpose, work: () => Promise<T>): Promise<T> {
  const value: LockValue = { holder: randomUUID(), purpose, until: 0 };
  const revision = await acquire(kv, key, value);
  try {
    return await work();
  } finally {
    // Taken over after a stall past its deadline: the new holder's lock stays.
    await kv.delete(key, { previousSeq: revision }).catch(() => undefined);
  }
}

/** The purpose of a live lock on `key`, undefined when none is held. */
export async function heldFor(kv: KV, key: string): Promise<LockPurpose | undefined> {
  const entry = await kv.get(key);
  if (entry?.operation !== "PUT" || entry.length === 0) return undefined;
  const held = entry.json<LockValue>();
  return held.until > Date.now() ? held.purpose : undefined;
}

/**
 * Resolves once no delete holds `key`: the delete has ended, refused or done, or its holder's
 * deadline has passed. A launch waits here instead of giving way at once, or a launch and a
 * delete that saw each other would both fail.
 */
export async function afterDelete(kv: KV, key: string): Promise<void> {
  for (let pause = 5; (await heldFor(kv, key)) === "delete"; pause = Math.min(pause * 2, 100)) {
    await new Promise((resolve) => setTimeout(resolve, pause));
  }
}

async function acquire(kv: KV, key: string, value: LockValue): Promise<number> {
  const deadline = Date.now() + WAIT_MS;
  for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
    const mine = () => JSON.stringify({ ...value, until: Date.now() + HOLD_MS });
    const taken = await kv.create(key, mine()).catch(() => undefined);
    if (taken !== undefined) return taken;
    const entry = await kv.get(key);
    const stale = entry?.operation !== "PUT" || entry.length === 0 || entry.json<LockValue>().until <= Date.now();
    if (stale && entry) {
      const takenOver = await kv.update(key, mine(), entry.revision).catch(() => undefined);
      if (takenOver !== undefined) return takenOver;
    }
    if (Date.now() > deadline)
      throw ServiceUnavailable.make({}, { cause: new Error(`image name lock ${key} stayed busy`) });
    await new Promise((resolve) => setTimeout(resolve, pause));
  }
}

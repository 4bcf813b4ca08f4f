// A host uid per instance: drawn at random from a range no account uses (default 2^24 uids
// from 1,200,000,000), distinct among this host's live instances. No instance, and no other
// host process of an unprivileged uid, shares it: none can signal, trace or open another's files.
import { randomInt } from "node:crypto";

/** First uid of the range (`MICROVM_UID_BASE`). */
export const DEFAULT_UID_BASE = 1_200_000_000;
/** Size of the range: collisions between hosts on one machine are 1 in 2^24 per pair of instances. */
export const UID_RANGE = 1 << 24;

export interface UidPool {
  /** A uid no live instance of this host has. */
  take(): number;
  /**
   * Takes `uid` itself (a restored instance keeps the uid it was checkpointed with); false if in
   * use or out of range.
   */
  claim(uid: number): boolean;
  give(uid: number): void;
}

export function uidPool(base = DEFAULT_UID_BASE): UidPool {
  if (!Number.isInteger(base) || base < 65_536 || base + UID_RANGE > 4_294_967_294)
    throw new Error(`unusable uid base ${base}: it must leave ${UID_RANGE} uids between 65536 and 2^32 - 2`);
  const inUse = new Set<number>();
  return {
    take() {
      for (;;) {
        const uid = base + randomInt(UID_RANGE);
        if (inUse.has(uid)) continue;
        inUse.add(uid);
        return uid;
      }
    },
    claim(uid) {
      if (!Number.isInteger(uid) || uid < base || uid >= base + UID_RANGE || inUse.has(uid)) return false;
      inUse.add(uid);
      return true;
    },
    give: (uid) => void inUse.delete(uid),
  };
}

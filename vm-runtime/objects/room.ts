// The room a host has for activations of objects: at most `maxActive` at once, of them at most
// `maxActivePerPrincipal` one principal's, those starting counted with those running. A start
// past a limit first evicts an idle activation: at the principal's own limit only one of its own
// (one principal never evicts another's to pass its limit), at the host's anyone's.
import { ObjectLimitExceeded, ServiceUnavailable } from "../../schemas/index.ts";

/** An activation running here, as the room weighs it. */
export interface Occupant {
  readonly principal: string;
  /** No call waiting or running. */
  readonly idle: boolean;
  /** When its last call ended (monotonic ms). */
  readonly lastUsed: number;
  /** Chosen for eviction already: no other start picks it. */
  readonly evicting?: boolean;
}

export interface RoomLimits {
  readonly maxActive: number;
  readonly maxActivePerPrincipal: number;
}

export interface ActivationRoom<T extends Occupant> {
  /**
   * The activation to evict before `principal` starts one more among `running`; undefined when
   * there is room. Refuses with 429 ObjectLimitExceeded when the principal's own are all busy,
   * 503 when the host's are.
   */
  toEvict(principal: string, running: readonly T[]): T | undefined;
  /** Takes room for one starting activation of `principal`'s; the release gives it back, once. */
  reserve(principal: string): () => void;
}

/** The wait an ObjectLimitExceeded names, as ObjectBusy's: a call of the principal's may have ended by then. */
const LIMIT_RETRY_SECONDS = 1;

export function activationRoom<T extends Occupant>({
  maxActive,
  maxActivePerPrincipal,
}: RoomLimits): ActivationRoom<T> {
  let starting = 0;
  const startingBy = new Map<string, number>();
  return {
    toEvict(principal, running) {
      const own = running.filter((occupant) => occupant.principal === principal);
      if (own.length + (startingBy.get(principal) ?? 0) >= maxActivePerPrincipal) {
        const oldest = leastRecentIdle(own);
        if (oldest) return oldest;
        throw ObjectLimitExceeded.make({
          limit: maxActivePerPrincipal,
          retryAfterSeconds: LIMIT_RETRY_SECONDS,
          message:
            `your objects active on this host are ${maxActivePerPrincipal}, your most, each with a call under way ` +
            `or starting: try again in ${LIMIT_RETRY_SECONDS} s`,
        });
      }
      if (running.length + starting < maxActive) return undefined;
      const oldest = leastRecentIdle(running);
      if (oldest) return oldest;
      throw ServiceUnavailable.make({
        message: `this host runs its most objects (${maxActive}), each with a call under way: retry`,
      });
    },
    reserve(principal) {
      starting += 1;
      startingBy.set(principal, (startingBy.get(principal) ?? 0) + 1);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        starting -= 1;
        const left = startingBy.get(principal)! - 1;
        if (left > 0) startingBy.set(principal, left);
        else startingBy.delete(principal);
      };
    },
  };
}

/** The least recently called of `candidates` that is idle and not being evicted already. */
function leastRecentIdle<T extends Occupant>(candidates: readonly T[]): T | undefined {
  let oldest: T | undefined;
  for (const occupant of candidates)
    if (occupant.idle && !occupant.evicting && (!oldest || occupant.lastUsed < oldest.lastUsed)) oldest = occupant;
  return oldest;
}

// The headers of the owner protocol, named once: what a caller tells the process it sends an
// owned request to (passed on already, the owner that went silent, how long it waits).
import type { MsgHdrs } from "@nats-io/transport-node";

/** Marks a request passed to the owner: the receiver serves it or answers NotOwner (no loops). */
export const FORWARDED_HEADER = "Task-Object-Forwarded";
/**
 * Set by a caller whose request the owner did not answer: the owner id. The receiver does not
 * try that owner again; it waits for the key's takeover within the budget, or says who will take it.
 */
export const SUSPECT_HEADER = "Task-Object-Suspect";
/** How long (ms) the sender waits for this request: the receiver may hold it that long, less a reserve. */
export const BUDGET_HEADER = "Task-Object-Budget-Ms";

// The longest a caller's budget may hold a request at a receiver: a takeover (lease TTL + margin) fits.
const MAX_HOLD_MS = 10_000;
// Kept back from the sender's budget: the answer's way back.
const BUDGET_RESERVE_MS = 150;

/** The time a request may spend at its receiver: the sender's budget header, else `fallbackMs`. */
export function holdBudget(headers: MsgHdrs | undefined, fallbackMs: number): number {
  const sent = Number(headers?.get(BUDGET_HEADER));
  if (!(sent > 0)) return fallbackMs;
  return Math.max(1, Math.min(MAX_HOLD_MS, sent - BUDGET_RESERVE_MS));
}

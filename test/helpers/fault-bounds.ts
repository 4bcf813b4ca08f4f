// How long a task-object name may go unanswered across a fault: one set of bounds for the
// local-process cluster (test/faults/placement-cluster.test.ts) and compose in Docker
// (test/containers/compose.test.ts).

/** Failover target: a silent owner noticed (≤ 1 s) + lease TTL + 0.5 s margin, rounded up. */
export const FAILOVER_BOUND_MS = 5_000;
/**
 * A paused (SIGSTOPped) owner: its requests are hedged to the process that takes each name over
 * once the lease may be claimed (found silent ≈ 0.5 s + lease TTL 2 s + margin 0.5 s), on timers
 * that a saturated CPU delays. `npm run bench:takeover` beside a CPU hog (load average 15-42),
 * 15 pauses: median 4.3 s, max 6.3 s (before the hedge, 10 pauses: median 5.6 s, max 9.8 s).
 */
export const PAUSED_OWNER_BOUND_MS = 8_000;
/** A killed NATS node also costs JetStream leader elections and client reconnects (test/cluster.test.ts: 15 s too). */
export const NATS_NODE_BOUND_MS = 15_000;

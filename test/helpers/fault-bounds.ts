// How long a task-object name may go unanswered across a fault: one set of bounds for the
// local-process cluster (test/faults/placement-cluster.test.ts) and compose in Docker
// (test/containers/compose.test.ts).

/**
 * A killed owner: found gone (≤ 1 s: its subject has no responders, or a direct attempt and a
 * hedge time out) + lease TTL 2 s + margin 0.5 s = 3.5 s on an idle machine, doubled for timers
 * a saturated CPU delays, as the bounds below. The compose test beside a CPU hog (load ~25) saw
 * a name unanswered for 5.96 s once, past the 5 s this bound was before without that allowance.
 */
export const FAILOVER_BOUND_MS = 7_000;
/**
 * A paused (SIGSTOPped) owner: its requests are hedged to the process that takes each name over
 * once the lease may be claimed (found silent ≈ 0.5 s + lease TTL 2 s + margin 0.5 s), on timers
 * that a saturated CPU delays. `npm run bench:takeover` beside a CPU hog (load average 15-42),
 * 15 pauses: median 4.3 s, max 6.3 s (before the hedge, 10 pauses: median 5.6 s, max 9.8 s).
 */
export const PAUSED_OWNER_BOUND_MS = 8_000;
/**
 * A killed NATS node: counted from the moment its buckets have leaders again (`leadersBack`), as
 * the elections are nats-server's (its Raft followers wait 4-9 s for a lost leader, and a split
 * vote costs another round: one CI run saw a name unanswered for 15.4 s). What is left is the
 * service's, from its own timers: a request reaches the process taking a name over within a
 * direct attempt and a hedge attempt (0.5 s each, placement/caller.ts); that process claims the
 * lapsed lease TTL 2 s + margin 0.5 s after it first read it, which is after the leaders are
 * back (placement/leases.ts); then two writes: 3.5 s on an idle machine, doubled (and rounded
 * up) for timers a saturated CPU delays, as for a paused owner. The processes that were
 * connected to the killed node are connected again before that: they dial the next address at
 * once (a dead one fails in ms on loopback, in ~3 s in Docker with EHOSTUNREACH), which the
 * lost leader's election (4-9 s) covers; a gateway answers 503 at once meanwhile.
 * `test/faults/placement-cluster.test.ts`, 10 runs (5 beside a CPU hog): leaders back after
 * 4.3-8.6 s, every name answering 1.3-3.7 s later; compose in Docker beside a CPU hog (load
 * 15-20), 7 runs: leaders back after 1.4-7.8 s, every name answering at most 3.3 s later.
 */
export const NATS_NODE_BOUND_MS = 8_000;

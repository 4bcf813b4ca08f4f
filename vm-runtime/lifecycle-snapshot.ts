// Reading and restoring lifecycle snapshots: the contract state name (SUSPENDED while
// resuming), whether an operation's event is accepted now (else 409), and a restore that
// re-arms the timers XState does not persist.
import { createActor, type Actor, type SnapshotFrom } from "xstate";
import type { lifecycleMachine } from "./lifecycle.ts";
import type { LifecycleEvent } from "./lifecycle-types.ts";
import type { MicrovmState } from "./states.ts";

export type LifecycleMachine = typeof lifecycleMachine;
export type LifecycleSnapshot = SnapshotFrom<LifecycleMachine>;
export type LifecycleActor = Actor<LifecycleMachine>;

/** The contract state of a snapshot: the top-level state (SUSPENDED.resuming is SUSPENDED). */
export function microvmState(snapshot: LifecycleSnapshot): MicrovmState {
  const value = snapshot.value;
  return (typeof value === "string" ? value : Object.keys(value)[0]) as MicrovmState;
}

/** True while a resume is under way (reported as SUSPENDED). */
export function isResuming(snapshot: LifecycleSnapshot): boolean {
  return snapshot.matches({ SUSPENDED: "resuming" });
}

/** Whether the machine takes `event` now; an operation answers 409 when it does not. */
export function canAccept(snapshot: LifecycleSnapshot, event: LifecycleEvent): boolean {
  return snapshot.status === "active" && snapshot.can(event);
}

/**
 * Restores an actor from `getPersistedSnapshot()` output (e.g. read from KV) and starts it.
 * XState does not persist delayed events, so the timers are re-armed with their original
 * deadlines (kept in context); an I/O actor that was running is started again.
 */
export function restoreLifecycle(machine: LifecycleMachine, persisted: unknown): LifecycleActor {
  const snapshot = persisted as LifecycleSnapshot;
  // The input is ignored when a snapshot is given; the typings still ask for one.
  const { microvmId, imageIdentifier, idlePolicy, timeouts, startedAt } = snapshot.context;
  const input = { microvmId, idlePolicy, timeouts, startedAt, ...(imageIdentifier === undefined ? {} : { imageIdentifier }) };
  const actor = createActor(machine, { snapshot, input });
  actor.start();
  actor.send({ type: "REARM_TIMERS" });
  return actor;
}

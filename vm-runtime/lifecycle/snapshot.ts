// Reading lifecycle snapshots: the contract state name (SUSPENDED while resuming) and whether
// an operation's event is accepted now (else 409).
import type { Actor, SnapshotFrom } from "xstate";
import type { lifecycleMachine } from "./machine.ts";
import type { LifecycleEvent } from "./types.ts";
import type { MicrovmState } from "../../schemas/index.ts";

export type LifecycleMachine = typeof lifecycleMachine;
export type LifecycleSnapshot = SnapshotFrom<LifecycleMachine>;
export type LifecycleActor = Actor<LifecycleMachine>;

/** The machine's top-level state names, as XState types its state values. */
type TopLevelState<Value> = Value extends string ? Value : keyof Value & string;
type MachineState = TopLevelState<LifecycleSnapshot["value"]>;

/** The machine's top-level states are the schema's list exactly: a state added on one side only fails to compile. */
const sameStates: [MachineState, MicrovmState] extends [MicrovmState, MachineState] ? true : never = true;
void sameStates;

/** The contract state of a snapshot: the top-level state (SUSPENDED.resuming is SUSPENDED). */
export function microvmState(snapshot: LifecycleSnapshot): MicrovmState {
  const value = snapshot.value;
  return typeof value === "string" ? value : (Object.keys(value)[0] as MachineState);
}

/** Whether the machine takes `event` now; an operation answers 409 when it does not. */
export function canAccept(snapshot: LifecycleSnapshot, event: LifecycleEvent): boolean {
  return snapshot.status === "active" && snapshot.can(event);
}

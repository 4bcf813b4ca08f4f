// Types and pure helpers of the lifecycle machine: its input, context, events, the inputs of
// its I/O actors, default deadlines, and the arithmetic of a timer's remaining time.
import type { MicrovmHandle } from "../host/provider.ts";
import { SNAPSHOT_STEP_SECONDS, type IdlePolicy } from "../../schemas/index.ts";
import { stateReason, type StateReason, type StateReasonText } from "../wire/state-reasons.ts";

/** Deadlines of the transient states, in milliseconds; past one the machine goes FAILED. */
export interface LifecycleTimeouts {
  readonly startMs: number;
  readonly suspendMs: number;
  readonly resumeMs: number;
  readonly terminateMs: number;
  /** Passed to `terminate`: SIGTERM-to-SIGKILL grace. Keep it below `terminateMs`. */
  readonly terminateGraceMs: number;
  /**
   * Checkpointing and storing a suspended instance's snapshot (SUSPENDING.checkpointing): the
   * longest it may go without progress (SNAPSHOT_PROGRESS), whatever the whole takes.
   */
  readonly checkpointMs: number;
  /** Loading and restoring it (SUSPENDED.restoring): the same, without progress. */
  readonly restoreMs: number;
}

export const DEFAULT_TIMEOUTS: LifecycleTimeouts = {
  startMs: 30_000,
  suspendMs: 10_000,
  resumeMs: 15_000,
  terminateMs: 15_000,
  terminateGraceMs: 2_000,
  checkpointMs: SNAPSHOT_STEP_SECONDS * 1000,
  restoreMs: SNAPSHOT_STEP_SECONDS * 1000,
};

/**
 * A suspend refused without harm (its snapshot would pass its owner's quota): the instance
 * runs on, as before it (`handle` absent) or restored from what it just saved (`handle`).
 */
export class SuspendRefused extends Error {
  override readonly name = "SuspendRefused";
  constructor(
    message: string,
    /** The owner's snapshot quota in bytes. */
    readonly quota: number,
    readonly handle?: MicrovmHandle,
  ) {
    super(message);
  }
}

/** What the record keeps of a stored snapshot (the snapshot store's answer), plain JSON. */
export interface SavedSnapshot {
  /** `sha256:<hex>` of the stored object. */
  readonly digest: string;
  readonly bytes: number;
  readonly createdAt: string;
}

export interface LifecycleInput {
  readonly microvmId: string;
  readonly imageIdentifier?: string;
  /** Durations in seconds; fractions are allowed (tests), 0 or less disables that timer. */
  readonly idlePolicy: IdlePolicy;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** ISO launch time reported by GetMicrovm (default: when the machine is created). */
  readonly startedAt?: string;
  /** Suspend checkpoints the instance into a stored snapshot (else it freezes it). */
  readonly checkpoints?: boolean;
}

export interface LifecycleContext {
  readonly microvmId: string;
  readonly imageIdentifier?: string;
  readonly idlePolicy: IdlePolicy;
  readonly timeouts: LifecycleTimeouts;
  /** Set once `start` resolves; cleared on TERMINATED. */
  readonly handle?: MicrovmHandle;
  /** ISO launch time (RunMicrovm), present from PENDING on. */
  readonly startedAt: string;
  /** Requests in flight as last reported by the proxy. */
  readonly inFlight: number;
  /** Why the instance is in its state (FAILED always has one). */
  readonly stateReason?: StateReasonText;
  /** Epoch ms the current timed state began (its timer counts from here). */
  readonly timerAnchor: number;
  /** Whether suspend checkpoints (SUSPENDING.checkpointing) rather than freezes. */
  readonly checkpoints: boolean;
  /** The stored snapshot of a checkpointed SUSPENDED instance (it then has no handle). */
  readonly saved?: SavedSnapshot;
  /** Why the last refused suspend was refused, the instance running on (a new object each time). */
  readonly suspendRefused?: { readonly message: string; readonly quota?: number };
}

/**
 * Events: operations (SUSPEND, RESUME, TERMINATE), proxy activity (requests in flight), and
 * the provider's word that the instance ended on its own (EXITED: out of memory, crashed).
 */
export type LifecycleEvent =
  | { readonly type: "EXITED"; readonly reason: StateReasonText }
  | { readonly type: "SUSPEND" }
  | { readonly type: "RESUME" }
  | { readonly type: "TERMINATE"; readonly reason?: StateReasonText }
  | { readonly type: "REQUEST_START"; readonly inFlight: number }
  | { readonly type: "REQUEST_END"; readonly inFlight: number }
  /** A snapshot being saved or restored moved on: its step's deadline counts from now. */
  | { readonly type: "SNAPSHOT_PROGRESS" };

export interface StartInput {
  readonly microvmId: string;
  readonly imageIdentifier?: string;
}

export interface HandleInput {
  readonly handle: MicrovmHandle;
}

export interface RestoreInput {
  readonly microvmId: string;
  readonly saved: SavedSnapshot;
}

export interface TerminateInput {
  /** Absent when the instance never finished starting. */
  readonly handle: MicrovmHandle | undefined;
  readonly graceMs: number;
}

/** Node clamps longer timeouts to 1 ms, so "never" is the longest a timer can wait. */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/** Milliseconds left of `durationMs` counted from `anchor` (epoch ms), within timer limits. */
export function remainingMs(durationMs: number, anchor: number, now = Date.now()): number {
  if (!Number.isFinite(durationMs)) return LONGEST_TIMER_MS;
  return Math.min(LONGEST_TIMER_MS, Math.max(0, durationMs - (now - anchor)));
}

/** `"<Reason>: <message>"` for a failed I/O actor, without stacks. */
export function failureReason(reason: StateReason, error: unknown): StateReasonText {
  return stateReason(reason, error instanceof Error ? error.message : typeof error === "string" ? error : "");
}

// The codes a microVM's `stateReason` starts with: why it is in its state (SUSPENDED,
// TERMINATED, FAILED, or SUSPENDED while it resumes), alone or followed by `: ` and words for
// a person (`StartFailed: the image threw`, `HostGone: host h1 does not answer`).

/** Every code, by name. */
export const StateReason = {
  /** The start failed: the image threw while loading, its wall did not come up, … */
  StartFailed: "StartFailed",
  /** The start passed its deadline. */
  StartTimedOut: "StartTimedOut",
  /** SuspendMicrovm asked for it. */
  SuspendRequested: "SuspendRequested",
  /** No request for `maxIdleDurationSeconds`: suspended. */
  IdleTimeout: "IdleTimeout",
  SuspendFailed: "SuspendFailed",
  SuspendTimedOut: "SuspendTimedOut",
  /** Saving a suspended instance's snapshot failed. */
  CheckpointFailed: "CheckpointFailed",
  CheckpointTimedOut: "CheckpointTimedOut",
  /** Suspended for `suspendedDurationSeconds`: terminated. */
  SuspendedDurationElapsed: "SuspendedDurationElapsed",
  /** Reported SUSPENDED while a resume or restore is under way. */
  Resuming: "Resuming",
  ResumeFailed: "ResumeFailed",
  ResumeTimedOut: "ResumeTimedOut",
  RestoreFailed: "RestoreFailed",
  RestoreTimedOut: "RestoreTimedOut",
  /** TerminateMicrovm asked for it. */
  TerminateRequested: "TerminateRequested",
  TerminateFailed: "TerminateFailed",
  TerminateTimedOut: "TerminateTimedOut",
  /** Its record was ended by another host or a caller while this host ran it. */
  TerminatedElsewhere: "TerminatedElsewhere",
  /** Its record was deleted while this host ran it. */
  RecordDeleted: "RecordDeleted",
  /** The same instance was launched twice on this host: the later one ends. */
  DuplicateRun: "DuplicateRun",
  /** Its image was deleted while it launched. */
  ImageDeleted: "ImageDeleted",
  /** It ended by itself (its runtime stopped, out of memory). */
  InstanceExited: "InstanceExited",
  /** Its host shut down (SIGTERM). */
  HostShutdown: "HostShutdown",
  /** Its host restarted and found its process gone or left running. */
  HostRestarted: "HostRestarted",
  /** Its host stopped answering. */
  HostGone: "HostGone",
} as const;

export type StateReason = (typeof StateReason)[keyof typeof StateReason];

/** A `stateReason`: a code alone, or with its detail. */
export type StateReasonText = StateReason | `${StateReason}: ${string}`;

/** `code`, or `code: detail` when there is a detail. */
export function stateReason(code: StateReason, detail?: string): StateReasonText {
  return detail ? `${code}: ${detail}` : code;
}

/** The reason of an instance whose runtime ended by itself. */
export const RUNTIME_STOPPED = stateReason(StateReason.InstanceExited, "the instance's runtime stopped");

/**
 * A reason read back from a stored record (written by this service, so one of these), with
 * `TerminatedElsewhere` for a record ended without one.
 */
export function storedReason(reason: string | undefined): StateReasonText {
  return (reason ?? StateReason.TerminatedElsewhere) as StateReasonText;
}

// Instance state names (contract) shared by the lifecycle machine, the proxy and callers.

/** An instance's state as GetMicrovm reports it (contract). */
export type MicrovmState = "PENDING" | "RUNNING" | "SUSPENDING" | "SUSPENDED" | "TERMINATING" | "TERMINATED" | "FAILED";

export const MICROVM_STATES: readonly MicrovmState[] = [
  "PENDING",
  "RUNNING",
  "SUSPENDING",
  "SUSPENDED",
  "TERMINATING",
  "TERMINATED",
  "FAILED",
];

/** The instance-level idle policy of RunMicrovm (contract). */
export interface IdlePolicy {
  readonly maxIdleDurationSeconds: number;
  readonly suspendedDurationSeconds: number;
  readonly autoResumeEnabled: boolean;
}

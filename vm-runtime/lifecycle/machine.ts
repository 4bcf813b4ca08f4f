// One instance's lifecycle as an XState v5 machine (PENDING → RUNNING → SUSPENDING → SUSPENDED
// → TERMINATING → TERMINATED; FAILED on any error or deadline). I/O lives in promise actors
// supplied with `.provide()`. Suspend freezes (SUSPENDING.freezing) or, where the instance
// checkpoints, stores a snapshot and ends it (SUSPENDING.checkpointing); resume thaws
// (SUSPENDED.resuming) or restores the snapshot (SUSPENDED.restoring), reported SUSPENDED until it answers.
import { and, assign, fromPromise, setup } from "xstate";
import type { MicrovmHandle } from "../host/provider.ts";
import type { IdlePolicy } from "../../schemas/index.ts";
import { StateReason, type StateReasonText } from "../wire/state-reasons.ts";
import {
  DEFAULT_TIMEOUTS,
  failureReason,
  remainingMs,
  type LifecycleContext,
  type LifecycleEvent,
  type HandleInput,
  type LifecycleInput,
  type RestoreInput,
  type SavedSnapshot,
  type StartInput,
  SuspendRefused,
  type TerminateInput,
} from "./types.ts";

/** Placeholder I/O: a machine used without `.provide()` fails loudly into FAILED. */
const notProvided = (name: string) => async (): Promise<never> => {
  throw new Error(`lifecycle actor "${name}" was not provided`);
};

const enabled = (seconds: number) => Number.isFinite(seconds) && seconds > 0;

/** The machine; give it real I/O with `lifecycleMachine.provide({ actors: { start, ... } })`. */
/**
 * A snapshot step whose deadline counts from its last progress: each `SNAPSHOT_PROGRESS`
 * enters its `moving` child again (the step itself runs on), and past `deadline` it fails.
 */
function movingUntil(deadline: "checkpointDeadline" | "restoreDeadline", reason: StateReason) {
  return {
    initial: "moving",
    states: {
      moving: {
        on: { SNAPSHOT_PROGRESS: { target: "moving", reenter: true, actions: "anchorTimer" } },
        after: {
          [deadline]: { target: "#microvm.FAILED", actions: { type: "setReason", params: { reason } } },
        },
      },
    },
  } as const;
}

export const lifecycleMachine = setup({
  types: {
    context: {} as LifecycleContext,
    events: {} as LifecycleEvent,
    input: {} as LifecycleInput,
  },
  actors: {
    start: fromPromise<MicrovmHandle, StartInput>(notProvided("start")),
    suspend: fromPromise<void, HandleInput>(notProvided("suspend")),
    resume: fromPromise<void, HandleInput>(notProvided("resume")),
    terminate: fromPromise<void, TerminateInput>(notProvided("terminate")),
    checkpoint: fromPromise<SavedSnapshot, HandleInput>(notProvided("checkpoint")),
    restore: fromPromise<MicrovmHandle, RestoreInput>(notProvided("restore")),
  },
  actions: {
    /** Starts the current timed state's clock. */
    anchorTimer: assign({ timerAnchor: () => Date.now() }),
    recordInFlight: assign({
      inFlight: ({ context, event }) =>
        event.type === "REQUEST_START" || event.type === "REQUEST_END" ? Math.max(0, event.inFlight) : context.inFlight,
    }),
    setReason: assign((_, params: { reason: StateReasonText }) => ({ stateReason: params.reason })),
    setFailure: assign((_, params: { reason: StateReason; error: unknown }) => ({
      stateReason: failureReason(params.reason, params.error),
    })),
    setTerminateReason: assign({
      stateReason: ({ event }) =>
        event.type === "TERMINATE" && event.reason ? event.reason : StateReason.TerminateRequested,
    }),
    clearReason: assign({ stateReason: undefined }),
    storeHandle: assign((_, params: { handle: MicrovmHandle }) => ({ handle: params.handle })),
    clearHandle: assign({ handle: undefined, inFlight: 0 }),
    /** The checkpoint ended the instance: its snapshot replaces its handle. */
    storeSaved: assign((_, params: { saved: SavedSnapshot }) => ({
      saved: params.saved,
      handle: undefined,
      inFlight: 0,
    })),
    /** Restored: the new handle replaces the snapshot. */
    storeRestored: assign((_, params: { handle: MicrovmHandle }) => ({ handle: params.handle, saved: undefined })),
    /** A refused suspend: the instance runs on, with the handle it has now. */
    storeRefusal: assign(({ context }, params: { refusal: SuspendRefused }) => ({
      handle: params.refusal.handle ?? context.handle,
      suspendRefused: { message: params.refusal.message, quota: params.refusal.quota },
    })),
    /** A repeated operation already under way: accepted (so `can()` is true), nothing to do. */
    acknowledge: () => undefined,
  },
  guards: {
    requestsInFlight: ({ context }) => context.inFlight > 0,
    noRequestsInFlight: ({ context }) => context.inFlight === 0,
    idleSuspendEnabled: ({ context }) => enabled(context.idlePolicy.maxIdleDurationSeconds),
    suspendedTerminateEnabled: ({ context }) => enabled(context.idlePolicy.suspendedDurationSeconds),
    checkpoints: ({ context }) => context.checkpoints,
    hasSnapshot: ({ context }) => context.saved !== undefined,
    suspendRefused: ({ event }) => "error" in event && event.error instanceof SuspendRefused,
  },
  delays: {
    idleTimeout: ({ context }) =>
      remainingMs(policyMs(context.idlePolicy, "maxIdleDurationSeconds"), context.timerAnchor),
    suspendedTimeout: ({ context }) =>
      remainingMs(policyMs(context.idlePolicy, "suspendedDurationSeconds"), context.timerAnchor),
    startDeadline: ({ context }) => remainingMs(context.timeouts.startMs, context.timerAnchor),
    suspendDeadline: ({ context }) => remainingMs(context.timeouts.suspendMs, context.timerAnchor),
    resumeDeadline: ({ context }) => remainingMs(context.timeouts.resumeMs, context.timerAnchor),
    terminateDeadline: ({ context }) => remainingMs(context.timeouts.terminateMs, context.timerAnchor),
    checkpointDeadline: ({ context }) => remainingMs(context.timeouts.checkpointMs, context.timerAnchor),
    restoreDeadline: ({ context }) => remainingMs(context.timeouts.restoreMs, context.timerAnchor),
  },
}).createMachine({
  id: "microvm",
  context: ({ input }) => ({
    microvmId: input.microvmId,
    ...(input.imageIdentifier === undefined ? {} : { imageIdentifier: input.imageIdentifier }),
    idlePolicy: input.idlePolicy,
    timeouts: { ...DEFAULT_TIMEOUTS, ...input.timeouts },
    startedAt: input.startedAt ?? new Date().toISOString(),
    inFlight: 0,
    timerAnchor: Date.now(),
    checkpoints: input.checkpoints ?? false,
  }),
  initial: "PENDING",
  on: {
    REQUEST_START: { actions: "recordInFlight" },
    REQUEST_END: { actions: "recordInFlight" },
  },
  states: {
    PENDING: {
      invoke: {
        src: "start",
        input: ({ context }) => ({
          microvmId: context.microvmId,
          ...(context.imageIdentifier === undefined ? {} : { imageIdentifier: context.imageIdentifier }),
        }),
        onDone: {
          target: "RUNNING",
          actions: { type: "storeHandle", params: ({ event }) => ({ handle: event.output }) },
        },
        onError: {
          target: "FAILED",
          actions: {
            type: "setFailure",
            params: ({ event }) => ({ reason: StateReason.StartFailed, error: event.error }),
          },
        },
      },
      entry: "anchorTimer",
      after: {
        startDeadline: {
          target: "FAILED",
          actions: { type: "setReason", params: { reason: StateReason.StartTimedOut } },
        },
      },
      on: { TERMINATE: { target: "TERMINATING", actions: "setTerminateReason" } },
    },
    RUNNING: {
      entry: "clearReason",
      on: {
        SUSPEND: [
          {
            guard: "checkpoints",
            target: "SUSPENDING.checkpointing",
            actions: { type: "setReason", params: { reason: StateReason.SuspendRequested } },
          },
          { target: "SUSPENDING", actions: { type: "setReason", params: { reason: StateReason.SuspendRequested } } },
        ],
        TERMINATE: { target: "TERMINATING", actions: "setTerminateReason" },
        EXITED: { target: "FAILED", actions: { type: "setReason", params: ({ event }) => ({ reason: event.reason }) } },
      },
      initial: "idle",
      states: {
        /** No request in flight: the idle clock runs; any activity restarts it. */
        idle: {
          entry: "anchorTimer",
          always: { guard: "requestsInFlight", target: "busy" },
          after: {
            idleTimeout: [
              {
                guard: and(["idleSuspendEnabled", "checkpoints"]),
                target: "#microvm.SUSPENDING.checkpointing",
                actions: { type: "setReason", params: { reason: StateReason.IdleTimeout } },
              },
              {
                guard: "idleSuspendEnabled",
                target: "#microvm.SUSPENDING",
                actions: { type: "setReason", params: { reason: StateReason.IdleTimeout } },
              },
            ],
          },
          on: {
            REQUEST_START: { target: "busy", actions: "recordInFlight" },
            REQUEST_END: { target: "idle", reenter: true, actions: "recordInFlight" },
          },
        },
        /** Requests in flight: never idle; back to idle (clock restarted) when the last ends. */
        busy: {
          always: { guard: "noRequestsInFlight", target: "idle" },
        },
      },
    },
    SUSPENDING: {
      entry: "anchorTimer",
      on: { TERMINATE: { target: "TERMINATING", actions: "setTerminateReason" } },
      initial: "freezing",
      states: {
        /** The freezer: the instance keeps its processes and memory on this host. */
        freezing: {
          invoke: {
            src: "suspend",
            input: ({ context }) => ({ handle: requireHandle(context) }),
            onDone: { target: "#microvm.SUSPENDED" },
            onError: {
              target: "#microvm.FAILED",
              actions: {
                type: "setFailure",
                params: ({ event }) => ({ reason: StateReason.SuspendFailed, error: event.error }),
              },
            },
          },
          after: {
            suspendDeadline: {
              target: "#microvm.FAILED",
              actions: { type: "setReason", params: { reason: StateReason.SuspendTimedOut } },
            },
          },
        },
        /**
         * The checkpoint: its snapshot is stored, and it holds no process once SUSPENDED. A
         * suspend refused without harm (SuspendRefused: over its owner's quota) runs on.
         */
        checkpointing: {
          invoke: {
            src: "checkpoint",
            input: ({ context }) => ({ handle: requireHandle(context) }),
            onDone: {
              target: "#microvm.SUSPENDED",
              actions: { type: "storeSaved", params: ({ event }) => ({ saved: event.output }) },
            },
            onError: [
              {
                guard: "suspendRefused",
                target: "#microvm.RUNNING",
                actions: { type: "storeRefusal", params: ({ event }) => ({ refusal: event.error as SuspendRefused }) },
              },
              {
                target: "#microvm.FAILED",
                actions: {
                  type: "setFailure",
                  params: ({ event }) => ({ reason: StateReason.CheckpointFailed, error: event.error }),
                },
              },
            ],
          },
          // The deadline counts from the last progress (the image written, chunks stored, the
          // queue of transfers moving): a large snapshot on a busy host takes longer, a stuck one fails.
          // Only the child is entered again: the checkpoint itself runs on.
          ...movingUntil("checkpointDeadline", StateReason.CheckpointTimedOut),
        },
      },
    },
    SUSPENDED: {
      on: {
        TERMINATE: { target: "TERMINATING", actions: "setTerminateReason" },
        EXITED: { target: "FAILED", actions: { type: "setReason", params: ({ event }) => ({ reason: event.reason }) } },
      },
      initial: "asleep",
      states: {
        asleep: {
          entry: "anchorTimer",
          after: {
            suspendedTimeout: {
              guard: "suspendedTerminateEnabled",
              target: "#microvm.TERMINATING",
              actions: { type: "setReason", params: { reason: StateReason.SuspendedDurationElapsed } },
            },
          },
          on: {
            RESUME: [
              {
                guard: "hasSnapshot",
                target: "restoring",
                actions: { type: "setReason", params: { reason: StateReason.Resuming } },
              },
              { target: "resuming", actions: { type: "setReason", params: { reason: StateReason.Resuming } } },
            ],
          },
        },
        /** Restoring its snapshot: still reported as SUSPENDED until the runtime answers. */
        restoring: {
          invoke: {
            src: "restore",
            input: ({ context }) => ({ microvmId: context.microvmId, saved: context.saved! }),
            onDone: {
              target: "#microvm.RUNNING",
              actions: { type: "storeRestored", params: ({ event }) => ({ handle: event.output }) },
            },
            onError: {
              target: "#microvm.FAILED",
              actions: {
                type: "setFailure",
                params: ({ event }) => ({ reason: StateReason.RestoreFailed, error: event.error }),
              },
            },
          },
          entry: "anchorTimer",
          // As the checkpoint's: counted from the last progress of the load.
          on: { RESUME: { actions: "acknowledge" } },
          ...movingUntil("restoreDeadline", StateReason.RestoreTimedOut),
        },
        /** Thawing: still reported as SUSPENDED until the runtime answers again. */
        resuming: {
          invoke: {
            src: "resume",
            input: ({ context }) => ({ handle: requireHandle(context) }),
            onDone: { target: "#microvm.RUNNING" },
            onError: {
              target: "#microvm.FAILED",
              actions: {
                type: "setFailure",
                params: ({ event }) => ({ reason: StateReason.ResumeFailed, error: event.error }),
              },
            },
          },
          entry: "anchorTimer",
          after: {
            resumeDeadline: {
              target: "#microvm.FAILED",
              actions: { type: "setReason", params: { reason: StateReason.ResumeTimedOut } },
            },
          },
          on: { RESUME: { actions: "acknowledge" } },
        },
      },
    },
    TERMINATING: {
      invoke: {
        src: "terminate",
        input: ({ context }) => ({ handle: context.handle, graceMs: context.timeouts.terminateGraceMs }),
        onDone: { target: "TERMINATED" },
        onError: {
          target: "FAILED",
          actions: {
            type: "setFailure",
            params: ({ event }) => ({ reason: StateReason.TerminateFailed, error: event.error }),
          },
        },
      },
      entry: "anchorTimer",
      after: {
        terminateDeadline: {
          target: "FAILED",
          actions: { type: "setReason", params: { reason: StateReason.TerminateTimedOut } },
        },
      },
      on: { TERMINATE: { actions: "acknowledge" } },
    },
    TERMINATED: { type: "final", entry: "clearHandle" },
    FAILED: {
      on: { TERMINATE: { target: "TERMINATING", actions: "setTerminateReason" } },
    },
  },
});

function requireHandle(context: LifecycleContext): MicrovmHandle {
  if (!context.handle) throw new Error(`instance ${context.microvmId} has no handle`);
  return context.handle;
}

function policyMs(policy: IdlePolicy, key: "maxIdleDurationSeconds" | "suspendedDurationSeconds"): number {
  return enabled(policy[key]) ? policy[key] * 1000 : Number.POSITIVE_INFINITY;
}

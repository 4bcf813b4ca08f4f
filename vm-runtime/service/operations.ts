// The owner's side of the operations that act on an instance (CreateAuthToken, SuspendMicrovm,
// ResumeMicrovm, TerminateMicrovm): events into the instance's machine, refused ones answered
// 409, the answer sent once the transition settled and its record is in KV. Without a live
// instance (gone, FAILED), the record alone decides. Each operation is spelled one way, by its
// contract's name; a transition's entry in `transitions` says what the machine does with it.
import type { Static } from "@sinclair/typebox";
import { createAuthToken as signToken, InvalidTokenRequest, type TokenKey } from "../wire/token.ts";
import type { LifecycleEvent } from "../lifecycle/types.ts";
import {
  decodeFailure,
  InvalidStateTransition,
  SnapshotQuotaExceeded,
  microvmApi,
  ownedOperations,
  type createAuthToken,
} from "../../schemas/index.ts";
import type { HostedInstance } from "./hosted.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore, type State } from "./store.ts";
import { StateReason } from "../wire/state-reasons.ts";

/** The operations that run on the instance's host: those of the microVM API placed `byHost`. */
export const instanceApi = ownedOperations(microvmApi);
/** An operation that must run on the instance's owner, by its contract's name. */
export type InstanceOp = keyof typeof instanceApi;
/** The instance operations that are a transition of the instance's machine. */
export type TransitionOp = Exclude<InstanceOp, "createAuthToken">;

interface Transition {
  /** "cannot <verb> an instance in state …" */
  readonly verb: string;
  /** The event sent into the instance's machine. */
  readonly event: LifecycleEvent;
  /** The states that settle it: the answer waits for one of them. */
  readonly settled: readonly State[];
  /** Which state takes it, said in a refusal from any other live state. */
  readonly takenIn?: string;
}

/**
 * Each transition's event and the states that settle it. A suspend settles RUNNING too when it
 * was refused (its snapshot would pass its owner's quota: the instance runs on). A new instance
 * operation is its contract, its entry here and its event in the machine.
 */
const transitions = {
  suspendMicrovm: {
    verb: "suspend",
    event: { type: "SUSPEND" },
    settled: ["SUSPENDED", "FAILED", "TERMINATING", "TERMINATED", "RUNNING"],
    takenIn: "only RUNNING suspends",
  },
  resumeMicrovm: {
    verb: "resume",
    event: { type: "RESUME" },
    settled: ["RUNNING", "FAILED", "TERMINATING", "TERMINATED"],
    takenIn: "only SUSPENDED resumes",
  },
  terminateMicrovm: { verb: "terminate", event: { type: "TERMINATE" }, settled: ["TERMINATED", "FAILED"] },
} as const satisfies Record<TransitionOp, Transition>;

/** The transitions, in the table's order. */
export const transitionOps = Object.keys(transitions) as TransitionOp[];

export type TokenInput = { microvmIdentifier: string; apiKeyId?: string | undefined } & Pick<
  Static<typeof createAuthToken.payload>,
  "expirationInMinutes" | "allowedPorts"
>;
export type TokenAnswer = Static<typeof createAuthToken.success>;
export type StateAnswer = { microvmId: string; state: State };

export interface OwnerDeps {
  readonly store: MicrovmStore;
  readonly tokenKey: TokenKey;
  /** Longest wait for a terminate before answering its transient state. */
  readonly settleMs: number;
}

const NO_TOKEN_STATES: readonly State[] = ["TERMINATING", "TERMINATED", "FAILED"];

/** CreateAuthToken on the owner: refused once the instance is ending or ended. */
export function ownerToken(
  deps: OwnerDeps,
  record: MicrovmRecord,
  hosted: HostedInstance | undefined,
  input: TokenInput,
): TokenAnswer {
  const state = hosted?.state() ?? record.state;
  if (!hosted || NO_TOKEN_STATES.includes(state)) throw refused(record.microvmId, state, "createAuthToken");
  try {
    const { token } = signToken(
      {
        microvmId: record.microvmId,
        expirationInMinutes: input.expirationInMinutes,
        allowedPorts: input.allowedPorts,
        ...(input.apiKeyId ? { apiKeyId: input.apiKeyId } : {}),
      },
      deps.tokenKey,
    );
    return { authToken: { "X-aws-proxy-auth": token } };
  } catch (err) {
    // What the schema cannot say, e.g. a range whose startPort is above its endPort.
    if (err instanceof InvalidTokenRequest) throw decodeFailure(["allowedPorts"], err.message);
    throw err;
  }
}

/**
 * SuspendMicrovm, ResumeMicrovm, TerminateMicrovm on the owner. Suspend and resume answer once
 * settled, within their contract's wait (the machine's checkpoint and restore deadlines end
 * them sooner); a suspend under way (the idle policy's) is waited out first.
 */
export async function ownerTransition(
  deps: OwnerDeps,
  op: TransitionOp,
  record: MicrovmRecord,
  hosted: HostedInstance | undefined,
): Promise<StateAnswer> {
  // A FAILED instance is being cleaned up by its host: the record alone decides.
  if (!hosted || hosted.state() === "FAILED")
    return recordOnly(deps, op, { ...record, state: hosted?.state() ?? record.state });
  const { microvmId } = record;
  const deadline = performance.now() + waitMsOf(deps, op);
  const left = () => Math.max(0, deadline - performance.now());
  const lastRefusal = () => hosted.instance.actor.getSnapshot().context.suspendRefused;
  let refusal = lastRefusal();
  let before = hosted.state();
  if (before === "SUSPENDING" && op !== "terminateMicrovm") {
    before = await hosted.settle(transitions.suspendMicrovm.settled, left());
    // The suspend under way is the one asked for: its outcome is the answer.
    if (op === "suspendMicrovm") return answer(hosted, microvmId, before, refusal);
    refusal = lastRefusal();
  }
  const { event, settled } = transitions[op];
  // Terminating an instance that is already ending answers its state (idempotent).
  const repeatTerminate = op === "terminateMicrovm" && (before === "TERMINATING" || before === "TERMINATED");
  if (!repeatTerminate && !hosted.instance.send(event)) throw refused(microvmId, hosted.state(), op);
  return answer(hosted, microvmId, await hosted.settle(settled, left()), refusal);
}

/**
 * What the machine's own deadline (SUSPENDING.checkpointing's, counted from the event sent
 * after this wait began) needs on top to end it first: the answer is then FAILED, not SUSPENDING.
 */
const DEADLINE_MARGIN_MS = 500;

function waitMsOf(deps: OwnerDeps, op: TransitionOp): number {
  // A suspend and a resume answer once settled: their contract says how long that may take.
  const contract: { waitMsOf?: () => number } = instanceApi[op];
  return contract.waitMsOf ? contract.waitMsOf() + DEADLINE_MARGIN_MS : deps.settleMs;
}

/**
 * The settled state once its record is written; a suspend refused meanwhile (a refusal other
 * than `earlierRefusal`, the last one before it) is a 429 with the reason: it runs on.
 */
async function answer(
  hosted: HostedInstance,
  microvmId: string,
  state: State,
  earlierRefusal: { readonly message: string; readonly quota?: number } | undefined,
): Promise<StateAnswer> {
  await hosted.writer.flush();
  const refusal = hosted.instance.actor.getSnapshot().context.suspendRefused;
  if (state === "RUNNING" && refusal !== earlierRefusal && refusal !== undefined)
    throw SnapshotQuotaExceeded.make({
      microvmId,
      quota: refusal.quota ?? 0,
      message: `the instance was not suspended and runs on: ${refusal.message}`,
    });
  return { microvmId, state };
}

/** No live instance on this host: only terminate has something to do (FAILED → TERMINATED). */
async function recordOnly(deps: OwnerDeps, op: TransitionOp, record: MicrovmRecord): Promise<StateAnswer> {
  if (op !== "terminateMicrovm") throw refused(record.microvmId, record.state, op);
  if (record.state === "TERMINATED" || record.state === "TERMINATING")
    return { microvmId: record.microvmId, state: record.state };
  const stored = await deps.store.update(record.microvmId, (current) =>
    current.state === "TERMINATED" ? undefined : terminated(current, "TERMINATED", StateReason.TerminateRequested),
  );
  return { microvmId: record.microvmId, state: stored?.record.state ?? "TERMINATED" };
}

/** 409 InvalidStateTransition: the instance's state does not take the operation. */
export function refused(microvmId: string, state: State, op: InstanceOp) {
  const transition: Transition | undefined = op === "createAuthToken" ? undefined : transitions[op];
  const verb = transition?.verb ?? "create a token for";
  const takenIn = !isTerminal(state) && transition?.takenIn ? ` (${transition.takenIn})` : "";
  return InvalidStateTransition.make({
    microvmId,
    state,
    message: `cannot ${verb} an instance in state ${state}${takenIn}`,
  });
}

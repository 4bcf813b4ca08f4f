// Ownership routing: an instance lives on the host that launched it. Every host also serves
// the instance operations on its own subjects `microvms.host.<host-token>.<op>` (no queue
// group); a host that gets a queue-group request for another host's instance forwards it
// there and relays the answer, declared errors included. A host with no subscriber is gone.
import { NoRespondersError, type NatsConnection } from "@nats-io/transport-node";
import {
  ApiError,
  ERROR_CODE_HEADER,
  nameToken,
  withPrefix,
  type Operation,
} from "../../schemas/index.ts";
import type { InstanceOp, StateAnswer } from "./operations.ts";
import { refused } from "./operations.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore } from "./store.ts";

/** `microvms.host.<base64url host id>`: the root of one host's own subjects (below the prefix). */
export function hostSubjectRoot(hostId: string): string {
  return `microvms.host.${nameToken(hostId)}`;
}

/** The full subject of `op` (or `ping`) on host `hostId`. */
export function hostSubject(prefix: string, hostId: string, op: InstanceOp | "ping"): string {
  return withPrefix(prefix, `${hostSubjectRoot(hostId)}.${op}`);
}

/** The instance operation an operation contract stands for (`microvms.suspend` → `suspend`). */
export function instanceOpOf(op: Operation): InstanceOp {
  return op.subject.slice(op.subject.lastIndexOf(".") + 1) as InstanceOp;
}

/** A copy of `op` served on host `hostId`'s own subject. */
export function onHost<Op extends Operation>(op: Op, hostId: string): Op {
  return { ...op, subject: `${hostSubjectRoot(hostId)}.${instanceOpOf(op)}` };
}

/** The owner has no subscriber on its subjects: its process is gone (so are its instances). */
export class OwnerUnreachable extends Error {
  override readonly name = "OwnerUnreachable";
}

/** Sends `input` to the owner's subject; resolves with its success value, rethrows its error. */
export async function forwardToOwner(
  nc: NatsConnection,
  subject: string,
  input: Record<string, unknown>,
  timeoutMs: number,
): Promise<unknown> {
  let reply;
  try {
    reply = await nc.request(subject, JSON.stringify(input), { timeout: timeoutMs });
  } catch (err) {
    if (isNoResponders(err)) throw new OwnerUnreachable(subject, { cause: err });
    throw err;
  }
  const code = reply.headers?.get(ERROR_CODE_HEADER);
  if (code) throw new ApiError(Number(code), reply.json());
  return reply.json();
}

/** True when an owner answers its ping (false: nobody subscribes to its subjects). */
export async function ownerAnswers(nc: NatsConnection, prefix: string, hostId: string, timeoutMs = 1_000): Promise<boolean> {
  try {
    await nc.request(hostSubject(prefix, hostId, "ping"), "", { timeout: timeoutMs });
    return true;
  } catch (err) {
    // A timeout is not proof of death (a busy or partitioned host): only "no responders" is.
    return !isNoResponders(err);
  }
}

export const hostGoneReason = (hostId: string) => `HostGone: host ${hostId} does not answer`;

/**
 * The owner is gone: its instances ended with it (a running instance exits with its host; a
 * suspended one is killed when the host id starts again). The record says so from now on.
 */
export async function ownerGone(store: MicrovmStore, record: MicrovmRecord, op: InstanceOp): Promise<StateAnswer> {
  const stored = await store.update(record.microvmId, (current) =>
    current.hostId === record.hostId && !isTerminal(current.state)
      ? terminated(current, "TERMINATED", hostGoneReason(record.hostId))
      : undefined,
  );
  const state = stored?.record.state ?? "TERMINATED";
  if (op === "terminate") return { microvmId: record.microvmId, state };
  throw refused(record.microvmId, state, op);
}

function isNoResponders(err: unknown): boolean {
  return err instanceof NoRespondersError || (err as { isNoResponders?: () => boolean }).isNoResponders?.() === true;
}

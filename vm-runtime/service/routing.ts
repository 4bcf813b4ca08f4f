// Ownership of instances: an instance lives on the host that launched it. Every host also
// serves the instance operations (placed `byHost`) on its own subjects
// `microvms.host.<host-token>.<op>` (no queue group), where other hosts forward requests for
// its instances (`forwardToOwner`). A host with no subscriber on its subjects is gone.
import type { NatsConnection } from "@nats-io/transport-node";
import { ownerSubjectRoot, withPrefix } from "../../schemas/index.ts";
import { isNoResponders } from "../../platform/index.ts";
import type { InstanceOp, StateAnswer } from "./operations.ts";
import { instanceApi, refused } from "./operations.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore } from "./store.ts";

/**
 * The full subject of `op` (or `ping`) on host `hostId`: `microvms.host.<host-token>.<tail>`,
 * the tail of the operation's own subject (`microvms.suspend` → `suspend`).
 */
export function hostSubject(prefix: string, hostId: string, op: InstanceOp | "ping"): string {
  const tail = op === "ping" ? op : instanceApi[op].subject.slice(instanceApi[op].subject.indexOf(".") + 1);
  return withPrefix(prefix, `${ownerSubjectRoot("microvms", "byHost", hostId)}.${tail}`);
}

/** True when an owner answers its ping (false: nobody subscribes to its subjects). */
export async function ownerAnswers(
  nc: NatsConnection,
  prefix: string,
  hostId: string,
  timeoutMs = 1_000,
): Promise<boolean> {
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
 * suspended one is killed when the host id starts again). The record says so from now on:
 * terminate answers its state; any other operation is refused (409).
 */
export async function ownerGone(store: MicrovmStore, record: MicrovmRecord, op: InstanceOp): Promise<StateAnswer> {
  const stored = await store.update(record.microvmId, (current) =>
    current.hostId === record.hostId && !isTerminal(current.state)
      ? terminated(current, "TERMINATED", hostGoneReason(record.hostId))
      : undefined,
  );
  const state = stored?.record.state ?? "TERMINATED";
  if (op === "terminateMicrovm") return { microvmId: record.microvmId, state };
  throw refused(record.microvmId, state, op);
}

// The owners of instances (placement `byHost`): an instance lives on the host that launched it.
// Every host serves the instance operations on its own subjects too,
// `microvms.host.<host-token>.<op>` (no queue group). The host that receives an instance
// operation reads the record (the caller must own it), runs it when the instance is its own (or
// the request came on its own subjects), and else passes it on to the owner's own subject and
// relays the answer. A host with no subscriber on its subjects is gone: its instances ended with
// it, and the record says so.
import type { NatsConnection } from "@nats-io/transport-node";
import {
  API_KEY_ID_HEADER,
  ownerKey,
  ownerSubject,
  ownerSubjectRoot,
  PRINCIPAL_HEADER,
  requestBody,
  ServiceUnavailable,
  withPrefix,
} from "../../schemas/index.ts";
import { isNoResponders } from "../../platform/index.ts";
import { natsSender, noAnswer, nobodyThere, send, answerOf, type OwnerStrategy } from "../../placement/index.ts";
import { readOwned, type HostedState, type HostState } from "./handlers.ts";
import { instanceApi, refused, type InstanceOp, type StateAnswer } from "./operations.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore } from "./store.ts";

/**
 * The full subject of `op` (or `ping`) on host `hostId`: `microvms.host.<host-token>.<tail>`,
 * the tail of the operation's own subject (`microvms.suspend` → `suspend`).
 */
export function hostSubject(prefix: string, hostId: string, op: InstanceOp | "ping"): string {
  const tail = op === "ping" ? op : instanceApi[op].subject.slice(instanceApi[op].subject.indexOf(".") + 1);
  return withPrefix(prefix, `${ownerSubjectRoot("microvms", "byHost", hostId)}.${tail}`);
}

/** The owners of instances: each request runs on the host of its instance (see above). */
export function hostOwners(host: HostState): OwnerStrategy<HostedState> {
  const sender = natsSender(host.nc);
  return {
    ownerId: host.hostId,
    // No queue group: only this host serves its subjects.
    ownQueue: "",
    endpointSuffix: "-host",
    // Only hosts may publish on a host's subjects, so its principal header is believed.
    principal: (msg) => msg.headers?.get(PRINCIPAL_HEADER) || undefined,
    async route(op, input, context, own, work) {
      const { principal } = context;
      const { record } = await readOwned(host.store, ownerKey(op, input), principal);
      if (own || record.hostId === host.hostId) {
        return work({ record, hosted: host.instances.get(record.microvmId) }, context);
      }
      try {
        const subject = ownerSubject(op, record.hostId, input, host.prefix);
        const reply = await send(sender, subject, requestBody(op, input), {
          // An answer that waits for its transition (suspend, resume) takes that much longer.
          timeoutMs: host.forwardTimeoutMs + (op.waitMsOf?.(input) ?? 0),
          noRespondersMs: 0,
          span: `forward ${op.name}`,
          headers: { [PRINCIPAL_HEADER]: principal, [API_KEY_ID_HEADER]: context.headers?.get(API_KEY_ID_HEADER) },
        });
        return answerOf(reply) as Awaited<ReturnType<typeof work>>;
      } catch (err) {
        // An owner that did not answer in time is unavailable here, as any transport failure.
        if (noAnswer(err)) throw ServiceUnavailable.make({}, { cause: err });
        if (!nobodyThere(err)) throw err;
        // A host between two NATS connections has no subscriber for a moment: ask once more.
        await new Promise((resolve) => setTimeout(resolve, 300));
        if (await ownerAnswers(host.nc, host.prefix, record.hostId)) throw ServiceUnavailable.make({}, { cause: err });
        // Terminate answers TERMINATED; any other operation is refused (409) once the record says so.
        return (await ownerGone(host.store, record, op.name as InstanceOp)) as Awaited<ReturnType<typeof work>>;
      }
    },
  };
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

// The owners of instances (placement `byHost`): an instance lives on the host that launched
// it. The host that receives an instance operation reads the record (the caller must own it),
// runs it when the instance is its own (or the request came on its own subjects), and else
// passes it on to the owner's own subject and relays the answer; an owner found gone ends the
// record instead (its instances ended with it).
import type { Msg } from "@nats-io/transport-node";
import { API_KEY_ID_HEADER, ownerKey, PRINCIPAL_HEADER, ServiceUnavailable } from "../../schemas/index.ts";
import { isNoResponders } from "../../platform/index.ts";
import { forwardToOwner, natsRequests } from "../../actors/forward.ts";
import type { OwnerStrategy } from "../../actors/serve.ts";
import { readOwned, type HostedState, type HostState } from "./handlers.ts";
import type { InstanceOp } from "./operations.ts";
import { ownerAnswers, ownerGone } from "./routing.ts";

/** The principal on a host's own subjects: only hosts may publish there, so its header is believed. */
const fromHeader = (msg: Msg) => msg.headers?.get(PRINCIPAL_HEADER) || undefined;

export function hostOwners(host: HostState): OwnerStrategy<HostedState> {
  const requests = natsRequests(host.nc);
  return {
    ownerId: host.hostId,
    // No queue group: only this host serves its subjects.
    ownQueue: "",
    endpointSuffix: "-host",
    principal: fromHeader,
    async route(op, input, context, own, work) {
      const principal = context.principal!;
      const { record } = await readOwned(host.store, ownerKey(op, input), principal);
      if (own || record.hostId === host.hostId) {
        return work({ record, hosted: host.instances.get(record.microvmId) });
      }
      try {
        // Only hosts may publish on a host's subjects, so the owner believes the principal header.
        const headers: Record<string, string> = { [PRINCIPAL_HEADER]: principal };
        const apiKeyId = context.headers?.get(API_KEY_ID_HEADER);
        if (apiKeyId) headers[API_KEY_ID_HEADER] = apiKeyId;
        return await forwardToOwner(requests, op, record.hostId, input, {
          // An answer that waits for its transition (suspend, resume) takes that much longer.
          timeoutMs: host.forwardTimeoutMs + (op.waitMsOf?.(input) ?? 0),
          prefix: host.prefix,
          headers,
        });
      } catch (err) {
        if (!isNoResponders(err)) throw err;
        // A host between two NATS connections has no subscriber for a moment: ask once more.
        await new Promise((resolve) => setTimeout(resolve, 300));
        if (await ownerAnswers(host.nc, host.prefix, record.hostId)) throw ServiceUnavailable.make({}, { cause: err });
        // Terminate answers TERMINATED; any other operation is refused (409) once the record says so.
        return (await ownerGone(host.store, record, op.name as InstanceOp)) as Awaited<ReturnType<typeof work>>;
      }
    },
  };
}

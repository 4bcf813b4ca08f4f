// The bench's task client over NATS. `owner`: task-object requests go straight to the process
// holding the name (the gateway's owner routing), falling back to the shared subject; `shared`:
// always the shared subject, where a non-owner forwards to the owner.
import { randomUUID } from "node:crypto";
import { ClientError, natsClient, type Client } from "../client/index.ts";
import { leaseOwners } from "../actors/index.ts";
import { ownerRouting } from "../placement/index.ts";
import { recordStores, type NatsHandle } from "../platform/index.ts";
import {
  createTaskDO,
  getTaskDO,
  IDEMPOTENCY_KEY_HEADER,
  requestBody,
  taskApi,
  type Operation,
} from "../schemas/index.ts";

export type Routing = "owner" | "shared";

/** A Task API client as the placement bench drives it. */
export type TaskClient = Client<typeof taskApi>;

/** `replicas`: the buckets' (where the leases are kept follows it: `leaseBucketFor`). */
export function benchTaskClient(handle: NatsHandle, routing: Routing, replicas: number): TaskClient {
  const shared = natsClient(taskApi, handle.nc);
  if (routing === "shared") return shared;
  const leases = recordStores(handle.requester, { replicas }).taskObjectLeases;
  const owners = ownerRouting(handle, { byName: leaseOwners(leases) }, "");
  const viaOwner = async (op: Operation, input: Record<string, unknown>, headers: Record<string, string>) => {
    const reply = await owners.tryOwner(op, input, requestBody(op, input), headers, 2_000);
    if (!reply) return undefined;
    const body = JSON.parse(Buffer.from(reply.data).toString("utf8"));
    if (reply.status !== 200) throw new ClientError(reply.status, body);
    return body;
  };
  return {
    ...shared,
    async createTaskDO(input, options) {
      const idempotencyKey = options?.idempotencyKey ?? randomUUID();
      return (
        (await viaOwner(createTaskDO, input, { [IDEMPOTENCY_KEY_HEADER]: idempotencyKey })) ??
        shared.createTaskDO(input, { idempotencyKey })
      );
    },
    async getTaskDO(input) {
      return (await viaOwner(getTaskDO, input, {})) ?? shared.getTaskDO(input);
    },
  };
}

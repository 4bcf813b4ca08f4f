// Public entry of the actors: start the task, task-object and job actors on a connection.
// The microVM host is vm-runtime/service/ (`startMicrovmHost`).
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import {
  ANONYMOUS,
  jobApi,
  ownerKey,
  serviceNames,
  taskApi,
  taskObjectLeaseKey,
  viaGateway,
  type InputOf,
  type Operation,
  type ReadOperations,
} from "../schemas/index.ts";
import { log, Requester, type BatchPublisher, type RecordStores, type VersionedStore } from "../platform/index.ts";
import { MicroService, processMetadata } from "./discovery.ts";
import { jobHandlers } from "./jobs.ts";
import { leasedOwners, leaseOwner, Placement, type ActivationEvent, type InProcessRoute } from "../placement/index.ts";
import { inProcessOperation, principalHeader, serveApi, type ApiHandlers, type Handler } from "./serve.ts";
import { taskObjectDirectory } from "./task-object-directory.ts";
import { foldsFences, taskObjectHandlers, taskObjectReader, type TaskObjectStates } from "./task-objects.ts";
import { taskHandlers } from "./tasks.ts";

export { serveApi, serveOperation, type ApiHandlers, type ApiServeOptions, type Handler } from "./serve.ts";
export type { HandlerContext, OwnerStrategy } from "../placement/index.ts";
export {
  Mailboxes,
  Placement,
  LeaseLost,
  leaseOwner,
  type Activation,
  type ActivationEvent,
  type PlacementOptions,
} from "../placement/index.ts";
export { foldsFences } from "./task-objects.ts";
export { backfillDoneSubject, backfillIndexes } from "./backfill.ts";

/** The principal of the `internal` NATS user's requests on the public subjects, with API keys on. */
export const NATS_INTERNAL = "nats:internal";

export interface ActorOptions {
  /** Subject prefix shared with the gateways (empty for none). */
  prefix?: string;
  /** Batches replies per event-loop turn (pass the connection's `publisher`). */
  publisher?: BatchPublisher;
  /**
   * Whose records a request on the public subjects (`tasks.get`...) reads and writes: the
   * anonymous principal (default: API keys off), or the NATS user's (`nats:internal`) with
   * keys on. The gateway's copies (`gateway.tasks.get`...) carry their caller's principal.
   */
  natsPrincipal?: string;
  /** Request/reply for forwards to other processes (default: a new one on `nc`). */
  requester?: Requester;
  /** Task-object placement: lease TTL, idle release, routing budget, owner id. */
  placement?: {
    ownerId?: string;
    ttlMs?: number;
    idleMs?: number;
    routeBudgetMs?: number;
    /** Each activation's start and end (default: an info log line). */
    onActivation?: (event: ActivationEvent) => void;
    /** Report each write too (TASK_OBJECT_LOG_WRITES=1: an audit trail, one line per write). */
    logWrites?: boolean;
    /** Requests one name may have waiting here before more get 429 TaskObjectBusy (TASK_OBJECT_MAX_PENDING). */
    maxPending?: number;
  };
}

export interface ActorsHandle {
  /** This process's owner id in task-object leases. */
  readonly ownerId: string;
  /** Task-object names held here now. */
  readonly activations: number;
  /**
   * What a gateway in this process serves here without NATS (its `inProcess`): every operation
   * without an owner (tasks, jobs, the task-object directory), as the actors' subjects would.
   */
  readonly inProcess: ReadonlyMap<string, InProcessRoute>;
  /** Stops taking requests, lets those in flight finish, releases held task objects. */
  close(): Promise<void>;
}

/** The operations the actors serve: the Task API (task objects included) and the Job API. */
export const actorApi = { ...taskApi, ...jobApi } as const;

/**
 * The reads of the actors' operations that storage alone answers (those whose contract
 * declares `reads`), for any process to run: one missing fails to compile.
 */
export function storageReads(
  stores: Pick<RecordStores, "tasks" | "jobs" | "taskObjects" | "taskIndex">,
): ApiHandlers<ReadOperations<typeof actorApi>> {
  return {
    getTask: taskHandlers(stores.tasks, stores.taskIndex).getTask,
    getJob: jobHandlers(stores.jobs).getJob,
    getTaskDO: taskObjectReader(stores.taskObjects),
  };
}

/** The owner of `principal`'s task object `name`, as its lease says (undefined: nobody holds it). */
export function leaseOwners(leases: VersionedStore): (name: string, principal: string) => Promise<string | undefined> {
  return async (name, principal) => {
    const key = taskObjectLeaseKey(name, principal);
    return key === undefined ? undefined : leaseOwner((await leases.get(key)).value);
  };
}

/**
 * What a gateway may do without an actor hop: answer the reads storage alone answers, and
 * send task-object requests straight to the name's owner (read from the lease bucket).
 */
export function gatewayDispatch(stores: RecordStores) {
  return { storageReads: storageReads(stores), routing: { byName: leaseOwners(stores.taskObjectLeases) } };
}

/** A readable, unique owner id: host, pid and a random suffix (a restarted pid is a new owner). */
function newOwnerId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(4).toString("hex")}`;
}

/** Serves every task, task-object and job operation; replicas share each subject. */
export function startActors(nc: NatsConnection, stores: RecordStores, options: ActorOptions = {}): ActorsHandle {
  const prefix = options.prefix ?? "";
  const settings = options.placement ?? {};
  const ownerId = settings.ownerId ?? newOwnerId();
  const service = new MicroService(nc, {
    name: serviceNames.actors,
    description: "Tasks, jobs and named task objects",
    metadata: processMetadata(prefix, { owner: ownerId }),
  });
  const placement = new Placement({
    ownerId,
    leases: stores.taskObjectLeases,
    ttlMs: settings.ttlMs,
    idleMs: settings.idleMs,
    logWrites: settings.logWrites,
    maxPending: settings.maxPending,
    onActivation:
      settings.onActivation ?? ((event) => log.debug({ activation: event }, `task-object activation ${event.event}`)),
  });
  const requester = options.requester ?? new Requester(nc, options.publisher);
  const byName = leasedOwners({
    placement,
    sender: { nc, requester },
    prefix,
    // The subject carries the name, and the schema defaults it; the object is the caller's. A
    // name (256 characters at most) and a principal fit in a key.
    leaseKey: (op, input, principal) => taskObjectLeaseKey(ownerKey(op, input), principal)!,
    routeBudgetMs: settings.routeBudgetMs,
  });
  const deps = {
    store: stores.taskObjects,
    index: stores.taskObjectIndex,
    placement,
    fenceInCreate: foldsFences(nc.info?.version, stores.taskObjectLeases, stores.taskObjects),
  };
  const handlers: ApiHandlers<typeof actorApi, TaskObjectStates> = {
    ...taskHandlers(stores.tasks, stores.taskIndex),
    ...jobHandlers(stores.jobs),
    ...taskObjectHandlers(deps),
    ...taskObjectDirectory({
      records: stores.taskObjects,
      index: stores.taskObjectIndex,
      leases: stores.taskObjectLeases,
    }),
  };
  // Every operation on its shared subject, in a queue group of all actor processes; the
  // task-object ones also on this process's own subjects, each request routed to its name's owner.
  const natsPrincipal = options.natsPrincipal ?? ANONYMOUS;
  const common = {
    prefix,
    publisher: options.publisher,
    queue: (op: { name: string }) => `actors.${op.name}`,
    owners: { byName },
  };
  const served = serveApi(nc, actorApi, handlers, {
    ...common,
    principal: () => natsPrincipal,
    discovery: { service },
  });
  // The gateway's copies: the same queue groups, the principal from its header.
  const viaGatewayServed = serveApi(nc, actorApi, handlers, {
    ...common,
    serveAs: viaGateway,
    principal: principalHeader,
    discovery: { service, name: (op) => `${op.name}-gateway` },
    ownSubjects: false,
  });
  const subscriptions: Subscription[] = [...served.own, ...served.shared, ...viaGatewayServed.shared];
  return {
    ownerId: placement.ownerId,
    inProcess: statelessHere(handlers),
    get activations() {
      return placement.activations;
    },
    async close() {
      // A dropped connection cannot drain; the leases are then left to lapse.
      await Promise.allSettled([...subscriptions.map((s) => s.drain()), service.close()]);
      await placement.close();
      if (!options.requester) requester.close();
    },
  };
}

/** The in-process routes of the actors' operations without an owner (`ActorsHandle.inProcess`). */
function statelessHere(handlers: ApiHandlers<typeof actorApi, TaskObjectStates>): ReadonlyMap<string, InProcessRoute> {
  const byKey = handlers as unknown as Record<string, Handler<Operation>>;
  const routes = new Map<string, InProcessRoute>();
  for (const [key, op] of Object.entries(actorApi)) {
    if (op.placement.kind !== "stateless") continue;
    const call = inProcessOperation(op as Operation, byKey[key]!);
    routes.set(op.name, { here: () => true, call: (input, headers) => call(input as InputOf<Operation>, headers) });
  }
  return routes;
}

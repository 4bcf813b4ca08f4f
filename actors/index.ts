// Public entry of the actors: start the task, task-object and job actors on a connection,
// and the microVM host (`startMicrovmHost`, in `microvms/`).
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { jobApi, taskApi, type Operation } from "../schemas/index.ts";
import { log, Requester, type BatchPublisher, type RecordStores } from "../platform/index.ts";
import { jobHandlers } from "./jobs.ts";
import { Placement, type ActivationEvent } from "./placement.ts";
import { serveOperation, type Handler } from "./serve.ts";
import { serveTaskObjects } from "./task-objects.ts";
import { taskHandlers } from "./tasks.ts";

export { serveOperation, toApiError, type Handler, type HandlerContext } from "./serve.ts";
export { Mailboxes } from "./mailbox.ts";
export { Placement, LeaseLost, leaseOwner, type ActivationEvent, type PlacementOptions } from "./placement.ts";
export { ownerSubject } from "./task-objects.ts";
export { startMicrovmHost, type MicrovmHost, type MicrovmHostOptions } from "./microvms/index.ts";

export interface ActorOptions {
  /** Subject prefix shared with the gateways (empty for none). */
  prefix?: string;
  /** Batches replies per event-loop turn (pass the connection's `publisher`). */
  publisher?: BatchPublisher;
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
  };
}

export interface ActorsHandle {
  /** This process's owner id in task-object leases. */
  readonly ownerId: string;
  /** Task-object names held here now. */
  readonly activations: number;
  /** Stops taking requests, lets those in flight finish, releases held task objects. */
  close(): Promise<void>;
}

/** The stateless read and create handlers of tasks and jobs, by operation name. */
export function operationHandlers(stores: Pick<RecordStores, "tasks" | "jobs">) {
  return { ...taskHandlers(stores.tasks), ...jobHandlers(stores.jobs) };
}

/** A readable, unique owner id: host, pid and a random suffix (a restarted pid is a new owner). */
function newOwnerId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(4).toString("hex")}`;
}

/** Serves every task, task-object and job operation; replicas share each subject. */
export function startActors(nc: NatsConnection, stores: RecordStores, options: ActorOptions = {}): ActorsHandle {
  const prefix = options.prefix ?? "";
  const handlers = operationHandlers(stores) as unknown as Record<string, Handler<Operation>>;
  const subscriptions: Subscription[] = [];
  for (const op of [...Object.values(taskApi), ...Object.values(jobApi)] as Operation[]) {
    const handler = handlers[op.name];
    if (!handler) continue; // the task-object operations, below
    subscriptions.push(serveOperation(nc, op, handler, { prefix, queue: `actors.${op.name}`, publisher: options.publisher }));
  }
  const settings = options.placement ?? {};
  const placement = new Placement({
    ownerId: settings.ownerId ?? newOwnerId(),
    leases: stores.taskObjectLeases,
    ttlMs: settings.ttlMs,
    idleMs: settings.idleMs,
    logWrites: settings.logWrites,
    onActivation: settings.onActivation ?? ((event) => log.info({ activation: event }, `task-object activation ${event.event}`)),
  });
  const requester = options.requester ?? new Requester(nc, options.publisher);
  subscriptions.push(
    ...serveTaskObjects(nc, { store: stores.taskObjects, placement, requester, prefix, routeBudgetMs: settings.routeBudgetMs }, options.publisher),
  );
  return {
    ownerId: placement.ownerId,
    get activations() {
      return placement.activations;
    },
    async close() {
      // A dropped connection cannot drain; the leases are then left to lapse.
      await Promise.allSettled(subscriptions.map((s) => s.drain()));
      await placement.close();
      if (!options.requester) requester.close();
    },
  };
}

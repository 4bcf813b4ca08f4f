// Public entry of the actors: start the task, task-object and job actors on a connection,
// and the microVM host (`startMicrovmHost`, in `microvms/`).
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { jobApi, taskApi, type Operation } from "../schemas/index.ts";
import type { BatchPublisher, RecordStores } from "../platform/index.ts";
import { jobHandlers } from "./jobs.ts";
import { serveOperation, type Handler } from "./serve.ts";
import { taskObjectHandlers } from "./task-objects.ts";
import { taskHandlers } from "./tasks.ts";

export { serveOperation, toApiError, type Handler, type HandlerContext } from "./serve.ts";
export { Mailboxes } from "./mailbox.ts";
export { startMicrovmHost, type MicrovmHost, type MicrovmHostOptions } from "./microvms/index.ts";

export interface ActorOptions {
  /** Subject prefix shared with the gateways (empty for none). */
  prefix?: string;
  /** Batches replies per event-loop turn (pass the connection's `publisher`). */
  publisher?: BatchPublisher;
}

export interface ActorsHandle {
  /** Stops taking requests; requests in flight finish (subscriptions drain). */
  close(): Promise<void>;
}

/** The handlers of every task, task-object and job operation, by operation name. */
export function operationHandlers(stores: RecordStores) {
  return {
    ...taskHandlers(stores.tasks),
    ...taskObjectHandlers(stores.taskObjects),
    ...jobHandlers(stores.jobs),
  };
}

/** Serves every task, task-object and job operation; replicas share each subject. */
export function startActors(nc: NatsConnection, stores: RecordStores, options: ActorOptions = {}): ActorsHandle {
  const prefix = options.prefix ?? "";
  const handlers = operationHandlers(stores);
  const subscriptions: Subscription[] = [];
  for (const op of [...Object.values(taskApi), ...Object.values(jobApi)] as Operation[]) {
    const handler = handlers[op.name as keyof typeof handlers] as unknown as Handler<Operation>;
    subscriptions.push(serveOperation(nc, op, handler, { prefix, queue: `actors.${op.name}`, publisher: options.publisher }));
  }
  return {
    async close() {
      await Promise.all(subscriptions.map((s) => s.drain()));
    },
  };
}

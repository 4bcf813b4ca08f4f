// The task-object actor: a stateful object per name (Durable-Object style). Each name has its
// own storage (keys `<name-token>.<id>` in the `taskobjects` bucket) and at most one live
// activation across all actor processes (placement.ts): a request that reaches a process not
// holding the name is forwarded to the owner's own subject (once), and its answer relayed.
import { performance } from "node:perf_hooks";
import { headers, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { LRUCache } from "lru-cache";
import { v4 as uuidv4 } from "uuid";
import {
  ApiError,
  ERROR_CODE_HEADER,
  GatewayTimeout,
  IDEMPOTENCY_KEY_HEADER,
  nameToken,
  NotOwner,
  REQUEST_ID_HEADER,
  requestBody,
  requestSubject,
  ServiceUnavailable,
  TaskNotFound,
  taskObjectKey,
  createTaskDO,
  getTaskDO,
  type Operation,
} from "../schemas/index.ts";
import {
  NoRespondersError,
  recordForward,
  RequestTimeoutError,
  type BatchPublisher,
  type RecordStore,
  type Requester,
} from "../platform/index.ts";
import { LeaseLost, type Activation, type Placement } from "./placement.ts";
import { createRecord, readRecord } from "./records.ts";
import { serveOperation, type Handler, type HandlerContext } from "./serve.ts";
import type { TaskRecord } from "./tasks.ts";

export interface TaskObjectHandlers {
  getTaskDO: Handler<typeof getTaskDO>;
  createTaskDO: Handler<typeof createTaskDO>;
}

export interface TaskObjectDeps {
  store: RecordStore;
  placement: Placement;
  /** Carries forwards to the owning process. */
  requester: Requester;
  /** Subject prefix shared with the gateways. */
  prefix: string;
  /** Records kept in memory for reads (default 50,000; 0: none). Records never change. */
  cacheEntries?: number;
  /** Time a request may spend reaching its owner (default 1.2 s, under the gateway's 1.5 s attempt). */
  routeBudgetMs?: number;
}

// One forward attempt: a live owner answers in milliseconds; a paused one never does.
const FORWARD_ATTEMPT_MS = 500;
const WAIT_RECHECK_MS = 200;

/** Marks a request an actor passed to the owner: the receiver serves it or answers NotOwner. */
export const FORWARDED_HEADER = "Task-Object-Forwarded";

/** `taskobjects.owner.<owner-token>.{name}.<verb>`: the copy of `op` one process serves alone. */
export function onOwner<Op extends Operation>(op: Op, ownerId: string): Op {
  return { ...op, subject: op.subject.replace(/^taskobjects\./, `taskobjects.owner.${nameToken(ownerId)}.`) };
}

const ownerOps = new Map<string, Operation>();
/** The subject of `op` for `input` on process `ownerId`'s own subjects. */
export function ownerSubject(op: Operation, ownerId: string, input: Record<string, unknown>, prefix: string): string {
  const id = `${ownerId}\0${op.name}`;
  let opOnOwner = ownerOps.get(id);
  if (!opOnOwner) ownerOps.set(id, (opOnOwner = onOwner(op, ownerId)));
  return requestSubject(opOnOwner, input, prefix);
}

/**
 * Handlers for the shared subjects and this process's own: serve a held name, or forward the
 * request to its owner, unless it was forwarded already (then answer NotOwner: no loops).
 */
export function taskObjectHandlers(deps: TaskObjectDeps): TaskObjectHandlers {
  const { store, placement } = deps;
  const budgetMs = deps.routeBudgetMs ?? 1_200;

  // The owner reads its records from memory once seen: a record never changes after its
  // create, so a kept one stays true whoever owns the name later. Absence is never kept.
  const entries = deps.cacheEntries ?? 50_000;
  const records = entries > 0 ? new LRUCache<string, TaskRecord>({ max: entries }) : undefined;
  const read = (name: string, id: string) => async () => {
    const key = taskObjectKey(name, id);
    const task = key === undefined ? undefined : (records?.get(key) ?? (await readRecord<TaskRecord>(store, key)));
    if (!task) throw TaskNotFound.make({ id });
    records?.set(key!, task);
    return task;
  };
  const create = (name: string, task: TaskRecord) => async (activation: Activation) => {
    await placement.fence(activation);
    const key = taskObjectKey(name, task.id)!;
    const stored = await createRecord(store, key, task, (s) => s.title === task.title);
    records?.set(key, stored);
    return stored;
  };

  async function forward(owner: string, op: Operation, input: Record<string, unknown>, context: HandlerContext, timeoutMs: number) {
    const h = headers();
    if (context.idempotencyKey) h.set(IDEMPOTENCY_KEY_HEADER, context.idempotencyKey);
    const requestId = context.headers?.get(REQUEST_ID_HEADER);
    if (requestId) h.set(REQUEST_ID_HEADER, requestId);
    h.set(FORWARDED_HEADER, "1");
    const reply = await deps.requester.request(ownerSubject(op, owner, input, deps.prefix), requestBody(op, input), timeoutMs, h);
    const code = reply.headers?.get(ERROR_CODE_HEADER);
    if (!code) return { answer: reply.json<TaskRecord>() as TaskRecord };
    const body = reply.json<{ _tag: string }>();
    if (body._tag === NotOwner.tag) return { moved: true as const };
    throw new ApiError(Number(code), body);
  }

  /** Runs `work` where `name` lives: here if this process holds it, else at its owner. */
  async function routed(
    op: Operation,
    name: string,
    input: Record<string, unknown>,
    context: HandlerContext,
    work: (activation: Activation) => Promise<TaskRecord>,
  ): Promise<TaskRecord> {
    const mayForward = !context.headers?.has(FORWARDED_HEADER);
    const deadline = performance.now() + budgetMs;
    let suspect: string | undefined;
    let outcomeUnknown = false;
    for (;;) {
      const route = await placement.route(name, suspect);
      if (route.kind === "local") {
        try {
          return await placement.run(route.activation, work);
        } catch (err) {
          if (!(err instanceof LeaseLost)) throw err;
        }
      } else if (!mayForward) {
        throw NotOwner.make({});
      } else if (route.kind === "remote") {
        const timeout = Math.max(1, Math.min(FORWARD_ATTEMPT_MS, deadline - performance.now()));
        try {
          const outcome = await forward(route.owner, op, input, context, timeout);
          if (!("moved" in outcome)) {
            recordForward("answered");
            return outcome.answer;
          }
          recordForward("moved");
          placement.forget(name);
          suspect = undefined;
        } catch (err) {
          if (err instanceof NoRespondersError) recordForward("no_responders");
          else if (err instanceof RequestTimeoutError) recordForward("timeout");
          else throw err;
          outcomeUnknown ||= err instanceof RequestTimeoutError;
          suspect = route.owner;
        }
      } else {
        // Read the lease again now and then: a release lets the name be claimed at once.
        const pause = Math.min(route.until, deadline, performance.now() + WAIT_RECHECK_MS) - performance.now();
        if (pause > 0) await new Promise((r) => setTimeout(r, pause));
      }
      // A forward that timed out may still have run at the owner: its outcome is unknown.
      if (performance.now() >= deadline) throw outcomeUnknown ? GatewayTimeout.make({}) : ServiceUnavailable.make({});
    }
  }

  return {
    // `name` is always present: the subject carries it and the schema defaults it.
    getTaskDO: (input, context) => {
      const name = input.name ?? "default";
      return routed(getTaskDO, name, input, context, read(name, input.id));
    },
    createTaskDO: (input, context) => {
      const name = input.name ?? "default";
      // The id is fixed before any forward, so a repeated forward creates one record.
      const id = context.idempotencyKey ?? uuidv4();
      const task: TaskRecord = { id, title: input.title, completed: false };
      return routed(createTaskDO, name, input, { ...context, idempotencyKey: id }, create(name, task));
    },
  };
}

/** Serves the task-object operations: the shared subjects in a queue group, and this process's own. */
export function serveTaskObjects(nc: NatsConnection, deps: TaskObjectDeps, publisher?: BatchPublisher): Subscription[] {
  const handlers = taskObjectHandlers(deps);
  const ownerId = deps.placement.ownerId;
  const serve = <Op extends Operation>(op: Op, handler: Handler<Op>, queue: string) =>
    serveOperation(nc, op, handler, { prefix: deps.prefix, publisher, queue });
  return [
    serve(getTaskDO, handlers.getTaskDO, "actors.getTaskDO"),
    serve(createTaskDO, handlers.createTaskDO, "actors.createTaskDO"),
    serve(onOwner(getTaskDO, ownerId), handlers.getTaskDO, `owner.${ownerId}`),
    serve(onOwner(createTaskDO, ownerId), handlers.createTaskDO, `owner.${ownerId}`),
  ];
}

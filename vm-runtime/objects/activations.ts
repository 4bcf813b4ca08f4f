// The objects of the cluster as one microVM host runs them: each object has at most one
// activation, at the host holding its lease in the objects bucket (placement, lease key
// `objectKey`); a call reaching another host is relayed to the holder (relay.ts), or, when the
// lease is free or its holder gone past the lease's bound, this host claims it and runs the call
// in its activation (held.ts). Calls to one object run one at a time in arrival order (the
// activation's mailbox), at most `maxPending` waiting; storage writes carry the lease as their fence.
// A delete is routed as a call and runs in the mailbox too: a call behind it finds a new object.
import { performance } from "node:perf_hooks";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { LeaseLost, leaseOwner, Placement, type Activation } from "../../placement/index.ts";
import {
  log,
  microvmObjectsBusy,
  OBJECTS_BUCKET,
  versionedStore,
  type Requester,
  type VersionedStore,
} from "../../platform/index.ts";
import {
  ApiError,
  ImageNotFound,
  NotAnObject,
  ObjectBusy,
  ServiceUnavailable,
  SNAPSHOT_STEP_SECONDS,
} from "../../schemas/index.ts";
import { objectAlarms, type ObjectAlarms } from "./alarms.ts";
import { objectDirectory, type ObjectDirectory } from "./directory.ts";
import { objectKey, objectOfKey, type ObjectRef } from "./keys.ts";
import { answerJson, heldObjects } from "./held.ts";
import type { ObjectHibernation } from "./hibernation.ts";
import type { LaunchDeps } from "./launch.ts";
import {
  GONE,
  MOVED,
  relay,
  relayWatched,
  serveRelay,
  SILENT,
  type HolderRequest,
  type RelayRequest,
} from "./relay.ts";
import { objectStores, type ObjectStores } from "./storage.ts";
import type { ObjectActivations, ObjectAnswer } from "./types.ts";

/** Calls one object may have waiting or running; one more is refused with 429 ObjectBusy. */
export const DEFAULT_MAX_PENDING_CALLS = 64;
/**
 * The longest one call may run in its object's code before the activation is stopped: its
 * answer (an ObjectCallTimeout) then still reaches a caller that waits the call operation's 30 s.
 */
export const DEFAULT_CALL_TIMEOUT_MS = 25_000;
/** Time for an activation's instance to start and its session to open. */
export const DEFAULT_START_TIMEOUT_MS = 30_000;
/** Objects active on one host at once; past it the least recently called idle one is evicted. */
export const DEFAULT_MAX_ACTIVE = 50;
/**
 * Objects of one principal active on one host at once; past it that principal's least recently
 * called idle one is evicted, or, all busy, the start refused (429 ObjectLimitExceeded).
 */
export const DEFAULT_MAX_ACTIVE_PER_PRINCIPAL = 10;
/**
 * The longest an object may take to hibernate when its host stops, before its instance is
 * stopped instead (its memory lost): the deadline a microVM's suspend has for the same work, a
 * checkpoint and its upload to the snapshot store (SNAPSHOT_STEP_SECONDS). Objects hibernate
 * side by side, so a stop waits at most this long for them (after the calls queued for them).
 */
export const DEFAULT_STOP_HIBERNATE_MS = SNAPSHOT_STEP_SECONDS * 1000;

export interface ObjectActivationsOptions extends Omit<LaunchDeps, "startTimeoutMs" | "hibernation"> {
  readonly nc: NatsConnection;
  /** Carries lease, storage and alarm writes. */
  readonly requester: Requester;
  /** Subject prefix (empty for none). */
  readonly prefix: string;
  /** This host: the owner its leases name, and its relay subject. */
  readonly hostId: string;
  readonly stores?: ObjectStores;
  readonly alarms?: ObjectAlarms;
  /** Where the objects activated here are listed. */
  readonly directory?: ObjectDirectory;
  readonly maxPending?: number;
  /** Objects active here at once (default 50): each holds an instance. */
  readonly maxActive?: number;
  /** Objects of one principal active here at once (default 10). */
  readonly maxActivePerPrincipal?: number;
  /** The longest an object's hibernation may take when the host stops (default 30 s). */
  readonly stopHibernateMs?: number;
  readonly callTimeoutMs?: number;
  readonly startTimeoutMs?: number;
  /** A silent holder's lease is taken over this long (plus a margin) after its last renewal (default 3 s). */
  readonly leaseTtlMs?: number;
  /** Time for a relayed request's answer, its wait in the holder's mailbox included (default 65 s). */
  readonly relayTimeoutMs?: number;
  /** Snapshots of objects with `hibernate: "snapshot"`; without, they are evicted as `"none"`. */
  readonly hibernation?: ObjectHibernation;
}

/** The activations of one host, with what the host itself uses of them. */
export interface HostObjectActivations extends ObjectActivations {
  /** Runs the due alarm of the object `key` names (`startAlarmFiring`'s handler); throws to retry it. */
  fireAlarm(key: string): Promise<void>;
  /** Objects active on this host now. */
  activeHere(): ObjectRef[];
  /** Whether `object` is active on this host now (its calls run here). */
  holds(object: ObjectRef): boolean;
}

/** The refusal of a call to the object of lease key `key` while `pending` calls wait. */
const objectBusy = (key: string, pending: number) => {
  const object = objectOfKey(key);
  return ObjectBusy.make({
    image: object?.image ?? "",
    name: object?.name ?? "",
    retryAfterSeconds: BUSY_RETRY_SECONDS,
    message: `the object has ${pending} calls waiting, its most: try again in ${BUSY_RETRY_SECONDS} s`,
  });
};

const BUSY_RETRY_SECONDS = 1;
// An activation running an instance is pinned (its image's idleSeconds evicts it); one without
// (claimed by a takeover its request gave up on, or whose instance stopped) is released after this.
const BARE_IDLE_MS = 10_000;
const ROUTE_RECHECK_MS = 200;
// Placement's margin (its default): a lease unmoved for its TTL plus this may be taken over.
const TAKEOVER_MARGIN_MS = 500;

export function startObjectActivations(options: ObjectActivationsOptions): HostObjectActivations {
  const { nc, prefix, hostId } = options;
  const stores = options.stores ?? objectStores(options.requester);
  const alarms = options.alarms ?? objectAlarms(options.requester);
  const ttlMs = options.leaseTtlMs ?? 3_000;
  const relayTimeoutMs = options.relayTimeoutMs ?? 65_000;
  // Long enough for a gone holder's lease to lapse and be claimed here.
  const routeBudgetMs = 3 * ttlMs + 2_000;
  const launchDeps: LaunchDeps = {
    images: options.images,
    provider: options.provider,
    openSession: options.openSession,
    ...(options.output === undefined ? {} : { output: options.output }),
    startTimeoutMs: options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS,
    ...(options.hibernation === undefined ? {} : { hibernation: options.hibernation }),
  };
  const leases: VersionedStore = versionedStore(options.requester, OBJECTS_BUCKET);
  let closing = false;

  const placement = new Placement({
    ownerId: hostId,
    leases,
    ttlMs,
    idleMs: BARE_IDLE_MS,
    maxPending: options.maxPending ?? DEFAULT_MAX_PENDING_CALLS,
    // The name placement gives is the lease key (an object key).
    busy: (key, pending) => objectBusy(key, pending),
    // The task objects' metrics are theirs alone.
    metrics: {
      activations: () => undefined,
      queueDepth: () => undefined,
      busy: () => microvmObjectsBusy.inc(),
    },
    // A lease lost or lapsed (the host was cut off): its instance stops at once.
    onActivation: (event) => held.ended(event),
  });
  const held = heldObjects({
    placement,
    launch: launchDeps,
    stores,
    alarms,
    directory: options.directory ?? objectDirectory(options.requester),
    callTimeoutMs: options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS,
    maxActive: options.maxActive ?? DEFAULT_MAX_ACTIVE,
    maxActivePerPrincipal: options.maxActivePerPrincipal ?? DEFAULT_MAX_ACTIVE_PER_PRINCIPAL,
    stopHibernateMs: options.stopHibernateMs ?? DEFAULT_STOP_HIBERNATE_MS,
  });

  /** Runs `request` in `activation`'s mailbox (placement's `run`: LeaseLost once it lapsed). */
  const runHere = (activation: Activation, request: HolderRequest, signal?: AbortSignal) =>
    placement.run(activation, (a) =>
      request.op === "delete" ? held.remove(a, request.object) : held.run(a, request, signal),
    );

  /** Runs `request` where the object lives: here (claiming it if free), or at its holder. */
  async function atHolder(request: HolderRequest, signal?: AbortSignal): Promise<ObjectAnswer> {
    const key = objectKey(request.object);
    let deadline = performance.now() + routeBudgetMs;
    let suspect: string | undefined;
    for (;;) {
      if (closing) throw ServiceUnavailable.make({});
      const route = await placement.route(key, suspect);
      if (route.kind === "local") {
        try {
          return await runHere(route.activation, request, signal);
        } catch (err) {
          if (!(err instanceof LeaseLost)) throw err;
        }
      } else if (route.kind === "remote") {
        const answer = await relayWatched(nc, prefix, route.owner, request, relayTimeoutMs, {
          leases,
          leaseKey: key,
          marginMs: TAKEOVER_MARGIN_MS,
        });
        if (answer === GONE || answer === SILENT) {
          // Its lease lapses (or has): claimed here once it may be, within a budget from now.
          suspect = route.owner;
          deadline = Math.max(deadline, performance.now() + routeBudgetMs);
        } else if (answer !== MOVED) return answer;
        else {
          placement.forget(key);
          suspect = undefined;
        }
      } else {
        const pause = Math.min(route.until, deadline, performance.now() + ROUTE_RECHECK_MS) - performance.now();
        if (pause > 0) await new Promise((r) => setTimeout(r, pause));
      }
      if (performance.now() >= deadline) throw ServiceUnavailable.make({});
    }
  }

  /** A request another host relayed here: run only if this host holds the object (else MOVED). */
  async function relayed(request: RelayRequest): Promise<ObjectAnswer | typeof MOVED> {
    const key = objectKey(request.object);
    if (request.op === "active") return answerJson(200, held.has(key));
    if (request.op === "deactivate") {
      await held.deactivate(key, "deactivated");
      return answerJson(200, true);
    }
    if (closing) return MOVED;
    const route = await placement.route(key);
    if (route.kind !== "local") return MOVED;
    try {
      return await runHere(route.activation, request);
    } catch (err) {
      if (err instanceof LeaseLost) return MOVED;
      throw err;
    }
  }

  const subscription: Subscription = serveRelay(nc, prefix, hostId, relayed);

  return {
    call: (object, method, args, signal) => atHolder({ op: "call", object, method, args }, signal),

    async delete(object) {
      await atHolder({ op: "delete", object });
    },

    async deactivate(object) {
      const key = objectKey(object);
      if (await held.deactivate(key, "deactivated")) return;
      const owner = leaseOwner((await leases.get(key)).value);
      // A gone or silent holder's instance went with it, or stops when its lease lapses.
      if (owner && owner !== hostId)
        await relayWatched(nc, prefix, owner, { op: "deactivate", object }, relayTimeoutMs, {
          leases,
          leaseKey: key,
          marginMs: TAKEOVER_MARGIN_MS,
        });
    },

    async activeOn(object) {
      const key = objectKey(object);
      if (held.has(key)) return hostId;
      const owner = leaseOwner((await leases.get(key)).value);
      if (!owner || owner === hostId) return undefined;
      const answer = await relay(nc, prefix, owner, { op: "active", object }, 2_000).catch(() => undefined);
      return typeof answer === "object" && Buffer.from(answer.body).toString("utf8") === "true" ? owner : undefined;
    },

    async fireAlarm(key) {
      const object = objectOfKey(key);
      if (!object) {
        log.warn({ key }, "an alarm names no object: dropped");
        return;
      }
      try {
        const answer = await atHolder({ op: "alarm", object });
        if (answer.status < 200 || answer.status >= 300)
          throw new Error(`the object's alarm handler failed (status ${answer.status})`);
      } catch (err) {
        // The image went, or never was an object: no attempt will run this alarm.
        if (err instanceof ApiError && (err._tag === ImageNotFound.tag || err._tag === NotAnObject.tag)) {
          log.warn({ object: key, reason: err._tag }, "an object's alarm cannot run: dropped");
          return;
        }
        throw err;
      }
    },

    activeHere: () => held.objects(),
    holds: (object) => held.has(objectKey(object)),

    async close() {
      closing = true;
      await subscription.drain().catch(() => undefined);
      await held.stopAll();
      await placement.close(0);
    },
  };
}

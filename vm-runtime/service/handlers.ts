// The seven microVM operations as handlers of one host. Reads (get, list) answer from KV on
// any host; run launches here; token/suspend/resume/terminate are the owner's side only: the
// adapter routes each to the instance's host first (`hostOwners`, owners.ts).
import { createHash, randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/transport-node";
import type { HeldRequests } from "../../platform/index.ts";
import {
  API_KEY_ID_HEADER,
  IdempotencyKeyReused,
  ImageNotFound,
  MicrovmNotFound,
  DEFAULT_IDLE_POLICY,
  InvalidStateTransition,
  MicrovmStartTimeout,
  runWaitSeconds,
  type microvmApi,
} from "../../schemas/index.ts";
import type { ApiHandlers } from "../../actors/serve.ts";
import { imageHandlers } from "../registry/handlers.ts";
import { objectHandlers, type ObjectOperationDeps } from "../objects/index.ts";
import { parseImageIdentifier, type HeldModule, type ImageStore } from "../registry/store.ts";
import type { HostedInstance, HostedOptions } from "./hosted.ts";
import type { HostInstances } from "./host-instances.ts";
import { answerLogRead, type InstanceLogs } from "./logs.ts";
import { launchHosted } from "./hosted.ts";
import { type instanceApi, ownerToken, ownerTransition, transitionOps, type OwnerDeps } from "./operations.ts";
import { ownerOf, viewOf, type MicrovmRecord, type MicrovmStore, type Policy, type StoredRecord } from "./store.ts";
import { StateReason, stateReason } from "../wire/state-reasons.ts";

/** What the owner of an instance holds while it runs a request (`hostOwners`). */
export interface HostedState {
  /** The instance's record as read for this request. */
  readonly record: MicrovmRecord;
  /** The live instance, when this host runs it. */
  readonly hosted: HostedInstance | undefined;
}
export type HostStates = { readonly byHost: HostedState };
export type MicrovmHandlers = ApiHandlers<typeof microvmApi, HostStates>;
export type InstanceHandlers = ApiHandlers<typeof instanceApi, HostStates>;

/** What a host's handlers share: its connection and stores, and its instances (`HostInstances`). */
export interface HostState extends OwnerDeps {
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly hostId: string;
  readonly store: MicrovmStore;
  /** Registered images (metadata, modules, this host's module cache). */
  readonly images: ImageStore;
  /** Instances' output lines, stored per owner and instance. */
  readonly logs: InstanceLogs;
  /** Long polls held for the gateway, each ended when it says its HTTP client left. */
  readonly held: HeldRequests;
  readonly forwardTimeoutMs: number;
  /** This host's live instances and launches under way, and the limits they count against. */
  readonly instances: HostInstances;
  /** The objects this host reaches: their activations, directory, storage and alarms. */
  readonly objects: ObjectOperationDeps;
  /** Everything `launchHosted` needs besides the instance's own fields. */
  readonly launch: Omit<
    HostedOptions,
    "microvmId" | "owner" | "imageIdentifier" | "imageDigest" | "image" | "idlePolicy" | "onGone"
  >;
}

/** Handlers for the queue-group subjects `microvms.<op>`. */
export function queueHandlers(host: HostState): MicrovmHandlers {
  return {
    async runMicrovm(input, context) {
      const idlePolicy = { ...DEFAULT_IDLE_POLICY, ...input.idlePolicy };
      const imageIdentifier = input.imageIdentifier ?? "sandbox";
      const answer = await run(host, imageIdentifier, idlePolicy, context.principal, context.idempotencyKey);
      return input.wait === "running" ? untilRunning(host, answer, runWaitSeconds(input) * 1000) : answer;
    },
    async getMicrovm({ microvmIdentifier }, context) {
      return viewOf((await readOwned(host.store, microvmIdentifier, context.principal)).record);
    },
    async listMicrovms(_input, context) {
      const owned = (await host.store.list()).filter(({ record }) => ownerOf(record) === context.principal);
      const items = owned.map(({ record }) => viewOf(record));
      return {
        items: items.sort((a, b) => a.startedAt.localeCompare(b.startedAt) || a.microvmId.localeCompare(b.microvmId)),
      };
    },
    getMicrovmLogs: (input, context) =>
      // A line outlives the instance's record: either proves the instance the caller's.
      answerLogRead(
        host.logs,
        host.held,
        { owner: context.principal, id: input.microvmIdentifier, headers: context.headers },
        input,
        () => readOwned(host.store, input.microvmIdentifier, context.principal),
      ),
    ...instanceHandlers(host),
    ...imageHandlers({
      images: host.images,
      store: host.store,
      provider: host.launch.provider,
      reserveSlot: (principal) => host.instances.reserve(principal, "image check"),
    }),
    ...objectHandlers(host.objects),
  };
}

/**
 * The owner's side of the instance operations: the adapter (`serveApi` with `hostOwners`) runs
 * them only on the instance's host, with its record and live instance.
 */
function instanceHandlers(host: HostState): InstanceHandlers {
  const transitionHandlers = Object.fromEntries(
    transitionOps.map((op) => [
      op,
      async (_input: unknown, { owner }: { readonly owner: HostedState; readonly principal: string }) =>
        ownerTransition(host, op, owner.record, owner.hosted),
    ]),
  ) as Omit<InstanceHandlers, "createAuthToken">;
  return {
    createAuthToken: async (input, { owner, headers }) =>
      ownerToken(host, owner.record, owner.hosted, {
        ...input,
        apiKeyId: headers?.get(API_KEY_ID_HEADER) || undefined,
      }),
    ...transitionHandlers,
  };
}

/** RunMicrovm: answers at once with PENDING while the instance starts. */
async function run(
  host: HostState,
  imageIdentifier: string,
  idlePolicy: Policy,
  principal: string,
  idempotencyKey: string | undefined,
) {
  const microvmId = idempotencyKey ? keyedMicrovmId(principal, idempotencyKey) : randomUUID();
  if (idempotencyKey) {
    const stored = await host.store.read(microvmId);
    if (stored) return replay(stored, imageIdentifier, idlePolicy, principal);
  }
  const release = await host.instances.reserve(principal, "launch");
  // Its output is stored from its first line on, a crash at start included.
  const unkeep = host.logs.keep(microvmId, principal);
  let held: HeldModule | undefined;
  try {
    const image = await resolveImage(host.images, imageIdentifier, principal);
    held = image.module;
    const hosted = await launchHosted({
      ...host.launch,
      microvmId,
      owner: principal,
      imageIdentifier,
      imageDigest: image.record.digest,
      image: image.module.path,
      idlePolicy,
      onGone: (gone) => {
        host.instances.remove(gone);
        unkeep();
        image.module.release();
      },
    });
    if (!hosted) {
      // Another request with the same Idempotency-Key created the record first.
      unkeep();
      const stored = await readOr404(host.store, microvmId);
      return replay(stored, imageIdentifier, idlePolicy, principal);
    }
    host.instances.add(hosted);
    // The record exists now: a delete of the image from here on sees this instance (409);
    // one that started before it is seen here, and this launch gives way.
    if (!(await host.images.launchable(image.record))) {
      hosted.instance.send({
        type: "TERMINATE",
        reason: stateReason(StateReason.ImageDeleted, "the image was deleted while the instance launched"),
      });
      throw ImageNotFound.make({ imageIdentifier });
    }
    return { microvmId, endpoint: hosted.endpoint, state: "PENDING" as const };
  } catch (err) {
    held?.release();
    // A launch that failed before its instance existed has no onGone to stop storing its output.
    if (!host.instances.has(microvmId)) unkeep();
    throw err;
  } finally {
    release();
  }
}

/** States a starting instance does not leave for RUNNING. */
const NEVER_RUNNING = ["FAILED", "TERMINATING", "TERMINATED"] as const;
/** How often a wait for an instance of another host reads its record. */
const WAIT_POLL_MS = 100;

/**
 * RunMicrovm with `wait: "running"`: the answer once the instance is RUNNING; 409 when it
 * failed or is ending instead; 504 MicrovmStartTimeout when `waitMs` ran out first. An instance
 * of this host is awaited on its machine; one of another (an Idempotency-Key's replay) on its record.
 */
async function untilRunning(
  host: HostState,
  answer: { microvmId: string; endpoint: string; state: string },
  waitMs: number,
) {
  const { microvmId } = answer;
  const hosted = host.instances.get(microvmId);
  let state: string;
  let reason: string | undefined;
  if (hosted) {
    state = await hosted.settle(["RUNNING", ...NEVER_RUNNING], waitMs);
  } else {
    const deadline = Date.now() + waitMs;
    for (;;) {
      const record = (await readOr404(host.store, microvmId)).record;
      ({ state, stateReason: reason } = record);
      if (state === "RUNNING" || (NEVER_RUNNING as readonly string[]).includes(state) || Date.now() >= deadline) break;
      await new Promise((resolve) => setTimeout(resolve, Math.min(WAIT_POLL_MS, deadline - Date.now())));
    }
  }
  if (state === "RUNNING") return { ...answer, state: "RUNNING" as const };
  if ((NEVER_RUNNING as readonly string[]).includes(state)) {
    reason ??= hosted ? (await host.store.read(microvmId))?.record.stateReason : undefined;
    throw InvalidStateTransition.make({
      microvmId,
      state,
      message: `the instance is ${state} instead of RUNNING${reason ? `: ${reason}` : ""}`,
    });
  }
  throw MicrovmStartTimeout.make({
    microvmId,
    state,
    message:
      `the instance is still ${state} after ${waitMs / 1000} s: ` +
      "it goes on starting (GetMicrovm says when it runs) unless you terminate it",
  });
}

/**
 * The record of `name` (latest) or `name@digest` as `principal` sees it and its module on
 * this host's disk, held in the cache until released; 404 when either is gone.
 */
async function resolveImage(images: ImageStore, imageIdentifier: string, principal: string) {
  const parsed = parseImageIdentifier(imageIdentifier);
  const record =
    parsed &&
    (parsed.digest === undefined
      ? await images.latest(principal, parsed.name)
      : await images.version(principal, parsed.name, parsed.digest));
  const module = record && (await images.fetch(record));
  if (!record || !module) throw ImageNotFound.make({ imageIdentifier });
  return { record, module };
}

/**
 * The instance id an `Idempotency-Key` stands for, scoped to the caller: the same key of two
 * principals names two instances, so a key (another's instance id, say) tells nothing about
 * anyone else's. Shaped as a uuid v4 (as unkeyed ids are) from sha256 of principal and key.
 */
export function keyedMicrovmId(principal: string, idempotencyKey: string): string {
  const hash = createHash("sha256").update(`microvm-run\0${principal}\0${idempotencyKey}`).digest();
  hash[6] = (hash[6]! & 0x0f) | 0x40;
  hash[8] = (hash[8]! & 0x3f) | 0x80;
  const hex = hash.subarray(0, 16).toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A retried RunMicrovm: the same request answers the stored instance, another one is a 409. */
function replay({ record }: StoredRecord, imageIdentifier: string, idlePolicy: Policy, principal: string) {
  const same =
    ownerOf(record) === principal &&
    record.imageIdentifier === imageIdentifier &&
    JSON.stringify(sortedPolicy(record.idlePolicy)) === JSON.stringify(sortedPolicy(idlePolicy));
  if (!same) {
    throw IdempotencyKeyReused.make({
      id: record.microvmId,
      message: "this Idempotency-Key was used for a different request",
    });
  }
  return { microvmId: record.microvmId, endpoint: record.endpoint, state: record.state };
}

function sortedPolicy(policy: Policy): Policy {
  return {
    maxIdleDurationSeconds: policy.maxIdleDurationSeconds,
    suspendedDurationSeconds: policy.suspendedDurationSeconds,
    autoResumeEnabled: policy.autoResumeEnabled,
  };
}

async function readOr404(store: MicrovmStore, microvmIdentifier: string): Promise<StoredRecord> {
  const stored = await store.read(microvmIdentifier);
  if (!stored) throw MicrovmNotFound.make({ microvmIdentifier });
  return stored;
}

/** The record when `principal` owns it; another's instance is as absent as a missing one. */
export async function readOwned(
  store: MicrovmStore,
  microvmIdentifier: string,
  principal: string,
): Promise<StoredRecord> {
  const stored = await readOr404(store, microvmIdentifier);
  if (ownerOf(stored.record) !== principal) throw MicrovmNotFound.make({ microvmIdentifier });
  return stored;
}

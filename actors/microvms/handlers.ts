// The seven microVM operations as handlers of one host. Reads (get, list) answer from KV on
// any host; run launches here; token/suspend/resume/terminate run on the instance's owner:
// here when this host owns it, else forwarded to the owner's own subject.
import { randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  IdempotencyKeyReused,
  ImageNotFound,
  MicrovmLimitExceeded,
  MicrovmNotFound,
  ServiceUnavailable,
  type microvmApi,
} from "../../schemas/index.ts";
import type { Handler } from "../serve.ts";
import type { HostedInstance, HostedOptions } from "./hosted.ts";
import { launchHosted } from "./hosted.ts";
import { ownerToken, ownerTransition, type InstanceOp, type OwnerDeps, type TokenInput } from "./operations.ts";
import { forwardToOwner, hostSubject, ownerAnswers, ownerGone, OwnerUnreachable } from "./routing.ts";
import { viewOf, type MicrovmRecord, type MicrovmStore, type Policy, type StoredRecord } from "./store.ts";

type Api = typeof microvmApi;
export type MicrovmHandlers = { [K in keyof Api]: Handler<Api[K]> };
export type InstanceHandlers = Pick<MicrovmHandlers, "createAuthToken" | "suspendMicrovm" | "resumeMicrovm" | "terminateMicrovm">;

export interface HostState extends OwnerDeps {
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly hostId: string;
  readonly store: MicrovmStore;
  /** Image identifier → module path. */
  readonly images: Readonly<Record<string, string>>;
  readonly maxInstances: number;
  readonly forwardTimeoutMs: number;
  /** Live instances of this host by microvmId. */
  readonly instances: Map<string, HostedInstance>;
  /** Everything `launchHosted` needs besides the instance's own fields. */
  readonly launch: Omit<HostedOptions, "microvmId" | "imageIdentifier" | "image" | "idlePolicy" | "onGone">;
  /** Launches under way (they count against the limit). */
  launching: number;
  closing: boolean;
}

/** Handlers for the queue-group subjects `microvms.<op>`. */
export function queueHandlers(host: HostState): MicrovmHandlers {
  return {
    runMicrovm: (input, context) => run(host, input.imageIdentifier ?? "sandbox", input.idlePolicy, context.idempotencyKey),
    async getMicrovm({ microvmIdentifier }) {
      return viewOf((await readOr404(host.store, microvmIdentifier)).record);
    },
    async listMicrovms() {
      const items = (await host.store.list()).map(({ record }) => viewOf(record));
      return { items: items.sort((a, b) => a.startedAt.localeCompare(b.startedAt) || a.microvmId.localeCompare(b.microvmId)) };
    },
    ...instanceHandlers(host, true),
  };
}

/** Handlers for this host's own subjects: the request was routed here, so it is answered here. */
export function ownerHandlers(host: HostState): InstanceHandlers {
  return instanceHandlers(host, false);
}

function instanceHandlers(host: HostState, route: boolean): InstanceHandlers {
  const handler = (op: InstanceOp) => async (input: TokenInput) => {
    const { record } = await readOr404(host.store, input.microvmIdentifier);
    if (!route || record.hostId === host.hostId) return actHere(host, op, record, input);
    try {
      return await forwardToOwner(host.nc, hostSubject(host.prefix, record.hostId, op), input, host.forwardTimeoutMs);
    } catch (err) {
      if (!(err instanceof OwnerUnreachable)) throw err;
      // A host between two NATS connections has no subscriber for a moment: ask once more.
      if (await ownerAnswersAfter(host.nc, host.prefix, record.hostId, 300)) throw ServiceUnavailable.make({}, { cause: err });
      return ownerGone(host.store, record, op);
    }
  };
  // One body serves four contracts; the adapter has validated each input against its own.
  return {
    createAuthToken: handler("token"),
    suspendMicrovm: handler("suspend"),
    resumeMicrovm: handler("resume"),
    terminateMicrovm: handler("terminate"),
  } as unknown as InstanceHandlers;
}

function actHere(host: HostState, op: InstanceOp, record: MicrovmRecord, input: TokenInput): Promise<unknown> {
  const hosted = host.instances.get(record.microvmId);
  if (op === "token") return Promise.resolve().then(() => ownerToken(host, record, hosted, input));
  return ownerTransition(host, op, record, hosted);
}

/** RunMicrovm: answers at once with PENDING while the instance starts. */
async function run(host: HostState, imageIdentifier: string, idlePolicy: Policy, idempotencyKey: string | undefined) {
  if (!Object.hasOwn(host.images, imageIdentifier)) throw ImageNotFound.make({ imageIdentifier });
  const microvmId = idempotencyKey ?? randomUUID();
  if (idempotencyKey) {
    const stored = await host.store.read(microvmId);
    if (stored) return replay(stored, imageIdentifier, idlePolicy);
  }
  // 503: a retry (same Idempotency-Key) lands on another host.
  if (host.closing) throw ServiceUnavailable.make({});
  if (host.instances.size + host.launching >= host.maxInstances) {
    throw MicrovmLimitExceeded.make({
      limit: host.maxInstances,
      message: `this host runs its maximum of ${host.maxInstances} live instances`,
    });
  }
  host.launching += 1;
  try {
    const hosted = await launchHosted({
      ...host.launch,
      microvmId,
      imageIdentifier,
      image: host.images[imageIdentifier]!,
      idlePolicy,
      onGone: (gone) => {
        if (host.instances.get(gone.microvmId) === gone) host.instances.delete(gone.microvmId);
      },
    });
    if (!hosted) {
      // Another request with the same Idempotency-Key created the record first.
      const stored = await readOr404(host.store, microvmId);
      return replay(stored, imageIdentifier, idlePolicy);
    }
    if (hosted.state() !== "TERMINATED" && hosted.state() !== "FAILED") host.instances.set(microvmId, hosted);
    return { microvmId, endpoint: hosted.endpoint, state: "PENDING" as const };
  } finally {
    host.launching -= 1;
  }
}

/** A retried RunMicrovm: the same request answers the stored instance, another one is a 409. */
function replay({ record }: StoredRecord, imageIdentifier: string, idlePolicy: Policy) {
  const same =
    record.imageIdentifier === imageIdentifier &&
    JSON.stringify(sortedPolicy(record.idlePolicy)) === JSON.stringify(sortedPolicy(idlePolicy));
  if (!same) {
    throw IdempotencyKeyReused.make({ id: record.microvmId, message: "this Idempotency-Key was used for a different request" });
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

async function ownerAnswersAfter(nc: NatsConnection, prefix: string, hostId: string, pauseMs: number): Promise<boolean> {
  await new Promise((resolve) => setTimeout(resolve, pauseMs));
  return ownerAnswers(nc, prefix, hostId);
}

async function readOr404(store: MicrovmStore, microvmIdentifier: string): Promise<StoredRecord> {
  const stored = await store.read(microvmIdentifier);
  if (!stored) throw MicrovmNotFound.make({ microvmIdentifier });
  return stored;
}

// One running activation of an object on this host: its image resolved (name or name@digest, as
// its principal sees it), an instance started with the host's provider, and the session over the
// instance's runtime socket through which calls go in and storage and alarm requests come out.
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { ImageNotFound, NotAnObject } from "../../schemas/index.ts";
import { log } from "../../platform/index.ts";
import { RUNTIME_PORT, upstreamOf, type MicrovmHandle, type MicrovmProvider } from "../host/provider.ts";
import { parseImageIdentifier, type HeldModule, type ImageStore } from "../registry/store.ts";
import type { ObjectAlarms } from "./alarms.ts";
import { restoredOrFresh, type ObjectHibernation } from "./hibernation.ts";
import { objectKey, objectLogId, type ObjectRef } from "./keys.ts";
import type { ObjectStorage } from "./storage.ts";
import type { ObjectSessionOptions } from "./session.ts";
import type { ObjectAnswer, ObjectTraits } from "./types.ts";

/** What activations use of a session with a running activation (`ObjectSession` of session.ts). */
export interface ActivationSession {
  readonly traits: ObjectTraits;
  call(method: string, args: unknown[], signal?: AbortSignal): Promise<ObjectAnswer>;
  alarm(signal?: AbortSignal): Promise<ObjectAnswer>;
  /** Settles when the channel to the runtime closed (the instance ended, or `close`). */
  readonly closed: Promise<void>;
  close(): void | Promise<void>;
}

/** What a session is opened with: `openObjectSession`'s options, its limits and log left at their defaults. */
export type SessionRequest = Pick<
  ObjectSessionOptions,
  "upstream" | "headers" | "object" | "storage" | "alarms" | "onSuperseded"
>;

export type OpenSession = (request: SessionRequest) => Promise<ActivationSession>;

/** The images an activation may run: the registry's, as its principal sees them. */
export type ObjectImages = Pick<ImageStore, "latest" | "version" | "fetch">;

/** Where an activation's output lines go: the host's instance logs, stored as the object's. */
export interface ObjectOutput {
  /** Stores the lines of instance `microvmId` as `owner`'s lines of `storedAs` until the returned function is called. */
  keep(microvmId: string, owner: string, storedAs: string): () => void;
  /** Deletes `owner`'s stored lines of `storedAs`. */
  purge(owner: string, storedAs: string): Promise<void>;
}

export interface LaunchDeps {
  readonly images: ObjectImages;
  /** Without, an activation's output goes to the host's debug log only. */
  readonly output?: ObjectOutput;
  readonly provider: MicrovmProvider;
  readonly openSession: OpenSession;
  /** Time for the instance to start and its session to open. */
  readonly startTimeoutMs: number;
  /** Snapshots of objects with `hibernate: "snapshot"` (where the provider checkpoints). */
  readonly hibernation?: ObjectHibernation;
}

export interface StopOptions {
  readonly hibernate?: boolean;
  /** Bounds the hibernation. */
  readonly signal?: AbortSignal;
}

/** An object's activation running here. */
export interface RunningObject {
  readonly object: ObjectRef;
  readonly session: ActivationSession;
  readonly handle: MicrovmHandle;
  /**
   * Stops the instance and lets its module go; once, however often asked. With `hibernate`, an
   * object with `hibernate: "snapshot"` is checkpointed into its snapshot instead (where the
   * host can): its next activation restores it. A hibernation not done when `signal` aborts is
   * given up: the instance is stopped and nothing of it stays stored.
   */
  stop(options?: StopOptions): Promise<void>;
  /** Settles when the instance or its session ended by itself (or `stop`). */
  readonly ended: Promise<void>;
  /**
   * Its activation holds the object: the snapshot it started from (restored or not) is deleted,
   * so that no older memory comes back. Until then a failed start leaves the snapshot.
   */
  established(): Promise<void>;
}

/**
 * Starts `object`'s image in an instance (restored from its snapshot when it hibernated) and
 * opens its session, with `storage` and `alarms` bound to it. ImageNotFound when the principal
 * has no such image; NotAnObject when it is not an object.
 */
export async function launchObject(
  deps: LaunchDeps,
  object: ObjectRef,
  storage: ObjectStorage,
  alarms: ObjectAlarms,
  onSuperseded: (err: unknown) => void,
): Promise<RunningObject> {
  const module = await resolveModule(deps.images, object);
  const signal = AbortSignal.timeout(deps.startTimeoutMs);
  let handle: MicrovmHandle | undefined;
  let quiet = () => {};
  try {
    const restored = await restoredOrFresh(deps.hibernation, object, module.digest, signal);
    // Its output is the object's from the first line (a fresh start's module code runs at boot).
    const microvmId = restored.handle?.microvmId ?? `object-${randomUUID()}`;
    if (deps.output) quiet = deps.output.keep(microvmId, object.principal, objectLogId(object));
    handle = restored.handle ?? (await deps.provider.start({ microvmId, image: module.path }, signal));
    const upstream = deps.provider.upstream?.(handle, RUNTIME_PORT) ?? upstreamOf(handle, RUNTIME_PORT);
    if (!upstream) throw new Error("the instance has no runtime port");
    const session = await deps
      .openSession({
        upstream,
        ...(handle.upstreamHeaders === undefined ? {} : { headers: handle.upstreamHeaders }),
        object,
        storage,
        alarms,
        onSuperseded,
      })
      .catch((err: unknown) => {
        throw isNotAnObject(err) ? NotAnObject.make({ image: object.image }) : err;
      });
    return running(deps, object, session, handle, module, restored.snapshot, quiet);
  } catch (err) {
    if (handle) await deps.provider.terminate(handle, 0).catch(() => undefined);
    module.release();
    quiet();
    throw err;
  }
}

function running(
  { provider, hibernation }: LaunchDeps,
  object: ObjectRef,
  session: ActivationSession,
  handle: MicrovmHandle,
  module: HeldModule,
  fromSnapshot: boolean,
  /** Stops storing its output. */
  quiet: () => void,
): RunningObject {
  let stopped: Promise<void> | undefined;
  const terminate = () =>
    provider.terminate(handle, 1_000).catch((err: unknown) => log.warn({ err }, "stopping an object failed"));
  /**
   * Checkpoints the instance into the object's snapshot (the runtime closes the session); false
   * when it could not, or not before `signal` aborted.
   */
  const saved = async (signal?: AbortSignal): Promise<boolean> => {
    if (!hibernation || session.traits.hibernate !== "snapshot") return false;
    const started = performance.now();
    try {
      await untilAborted(hibernation.save(object, handle, module.digest, signal), signal);
      log.info({ object: objectKey(object), ms: Math.round(performance.now() - started) }, "object hibernated");
      return true;
    } catch (err) {
      if (signal?.aborted)
        log.warn({ object: objectKey(object) }, "an object did not hibernate in time: its memory is lost");
      else log.warn({ object: objectKey(object), err }, "an object could not hibernate: its memory is lost");
      return false;
    }
  };
  const stop = (options: StopOptions = {}) =>
    (stopped ??= (async () => {
      const hibernated = options.hibernate === true && (await saved(options.signal));
      await Promise.resolve(session.close()).catch(() => undefined);
      if (!hibernated) await terminate();
      module.release();
      quiet();
    })());
  // The instance may end by itself (it crashed, the wall died): the session closes with it.
  const exited = provider.exited?.(handle).then(() => undefined) ?? new Promise<void>(() => undefined);
  const ended = Promise.race([session.closed.catch(() => undefined), exited]);
  // Running again: its memory from now on is the one to keep, and the snapshot counts against the quota.
  const established = async () => {
    if (!fromSnapshot || !hibernation) return;
    await hibernation
      .discard(object)
      .catch((err: unknown) => log.warn({ object: objectKey(object), err }, "an object's snapshot was not deleted"));
  };
  return { object, session, handle, stop, ended, established };
}

/** `work`, or a rejection with `signal`'s reason once it aborts (`work` goes on: it heeds the signal itself). */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return work;
  work.catch(() => undefined);
  return new Promise<T>((resolve, reject) => {
    const abort = () => reject(signal.reason);
    if (signal.aborted) return abort();
    signal.addEventListener("abort", abort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", abort));
  });
}

/** The module of the object's image (latest, or the digest it names), held until released. */
async function resolveModule(images: ObjectImages, object: ObjectRef): Promise<HeldModule> {
  const parsed = parseImageIdentifier(object.image);
  const record =
    parsed &&
    (parsed.digest === undefined
      ? await images.latest(object.principal, parsed.name)
      : await images.version(object.principal, parsed.name, parsed.digest));
  const module = record && (await images.fetch(record));
  if (!module) throw ImageNotFound.make({ imageIdentifier: object.image });
  return module;
}

/** Whether the session refused the instance as no object (its readiness probe declared no traits). */
const isNotAnObject = (err: unknown): boolean =>
  (err as { _tag?: unknown } | null)?._tag === "NotAnObject" ||
  (err as { name?: unknown } | null)?.name === "NotAnObject";

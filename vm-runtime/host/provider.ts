// The provider interface: how an instance is isolated, started, frozen and stopped: the
// sandbox (sandbox-provider.ts: namespaces + cgroups) by default, or a plain process group
// (process-provider.ts) for development. A VM provider would implement the same interface.
import { INSTANCE_PORT_HEADER } from "../wire/rpc.ts";
import type { Upstream } from "../wire/forward.ts";
import type { StateReasonText } from "../wire/state-reasons.ts";

export type { Upstream };

/** The port the runtime (RPC + fetch) answers on, as seen through the proxy. */
export const RUNTIME_PORT = 8080;

/** What to start. */
export interface MicrovmSpec {
  readonly microvmId: string;
  /** Path of the image module (its default export is a `defineImage` result). */
  readonly image: string;
  /** Memory cap in MiB; the provider's default when absent. */
  readonly memoryMiB?: number;
  /**
   * The image's own share of the start: from its runtime's boot line (the host's work is done)
   * to its answer to the readiness probe. Past it the start fails with a `MicrovmImageTimeout`
   * however long the host took to boot the runtime, which stays bounded by the provider's start
   * timeout alone. Absent: one deadline, the provider's, for both.
   */
  readonly imageTimeoutMs?: number;
}

/** What to restore: the instance a checkpoint image holds. */
export interface RestoreSpec {
  readonly microvmId: string;
}

/** A started instance: plain JSON, so it can live in a persisted machine snapshot. */
export interface MicrovmHandle {
  readonly microvmId: string;
  /** Which provider started it (`"process"` for the default). */
  readonly provider: string;
  /** Address the instance's real ports listen on. */
  readonly host: string;
  /** Virtual port (what `X-aws-proxy-port` names) → real local port; "8080" is the runtime. */
  readonly ports: Readonly<Record<string, number>>;
  /**
   * The runtime's unix socket as the host reaches it (sandbox: the instance has no network
   * path out, so every port goes through it; the runtime forwards other ports inside).
   */
  readonly socketPath?: string;
  readonly pid?: number;
  /** Start time of `pid` in clock ticks after boot, so a reused pid is never signalled. */
  readonly pidStartTime?: number;
  /** Headers the proxy (and readiness probes) must add to reach the instance's ports. */
  readonly upstreamHeaders?: Readonly<Record<string, string>>;
  /** ISO time the instance answered its first readiness probe. */
  readonly startedAt: string;
}

export interface MicrovmProvider {
  readonly name: string;
  /** Resolves once the runtime answers HTTP; aborting `signal` kills a half-started instance. */
  start(spec: MicrovmSpec, signal?: AbortSignal): Promise<MicrovmHandle>;
  /**
   * Freezes the instance; resolves once it is frozen. The frozen instance keeps its processes
   * and memory on this host and does not survive it: `checkpoint` is the suspend that does.
   */
  suspend(handle: MicrovmHandle): Promise<void>;
  /** Thaws the instance; resolves once the runtime answers again. */
  resume(handle: MicrovmHandle): Promise<void>;
  /** Asks the instance to stop, forces it after `graceMs`; resolves once it is gone. */
  terminate(handle: MicrovmHandle, graceMs?: number): Promise<void>;
  isAlive(handle: MicrovmHandle): Promise<boolean>;
  /**
   * Resolves with a reason (`InstanceExited: …`) if the instance ends by itself, never when
   * `terminate` ended it; never resolves for a provider that cannot tell.
   */
  exited?(handle: MicrovmHandle): Promise<StateReasonText>;
  /** Where a request for `virtualPort` goes now; undefined when the instance cannot take it. */
  upstream?(handle: MicrovmHandle, virtualPort: number): Upstream | undefined;
  /**
   * Saves the instance, its memory and scratch files, into `imageDir` (an empty directory of
   * the host's) and ends it: once this resolves no process of it remains. Only providers that
   * can (gVisor); on a failure the instance is ended too, and the error says so.
   */
  checkpoint?(handle: MicrovmHandle, imageDir: string): Promise<void>;
  /**
   * An upper bound of the bytes `checkpoint` would write for the instance now (the memory it
   * holds), read without touching it: the room a suspend reserves in its owner's quota.
   */
  checkpointBound?(handle: MicrovmHandle): Promise<number>;
  /**
   * Starts the instance saved by `checkpoint` in `imageDir` again, with the memory and files it
   * had; resolves with its new handle once the runtime answers. A damaged image is a
   * `MicrovmProviderError`, within the provider's restore deadline.
   */
  restore?(spec: RestoreSpec, imageDir: string, signal?: AbortSignal): Promise<MicrovmHandle>;
  /**
   * Kills whatever an earlier run of this host left (found in its own cgroup or work
   * directory, never from a pid read from storage); resolves with what it killed.
   */
  reclaim?(): Promise<ReclaimedInstance[]>;
}

/** An instance of an earlier run that reclaim killed: the host pids it had. */
export interface ReclaimedInstance {
  readonly pids: readonly number[];
}

/** A provider operation failed; `cause` is the low-level failure. */
export class MicrovmProviderError extends Error {
  readonly _tag = "MicrovmProviderError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MicrovmProviderError";
  }
}

export interface MicrovmHostErrorOptions {
  readonly cause?: unknown;
  readonly timedOut?: boolean;
  readonly stderr?: string;
  readonly missing?: readonly string[];
}

/**
 * The host, not the image, failed to start an instance: its wall or node ended (a flag node
 * refuses, a binary gone, runsc or bubblewrap failing) or did not come up in time before the
 * runtime announced itself, so nothing of the image had run. `message` says so without host
 * detail (it may reach a user as a `stateReason`); `cause` holds what the wall printed.
 */
export class MicrovmHostError extends MicrovmProviderError {
  /** The wall did not come up before the deadline (or the caller gave up), rather than ending. */
  readonly timedOut: boolean;
  /** The last lines the wall wrote to stderr, read to their end (for the host's log only). */
  readonly stderr: string;
  /** Files the wall needs (node, its libraries, runsc or bwrap) that are not on the host now. */
  readonly missing: readonly string[];
  constructor(message: string, options: MicrovmHostErrorOptions = {}) {
    super(message, { cause: options.cause });
    this.name = "MicrovmHostError";
    this.timedOut = options.timedOut ?? false;
    this.stderr = options.stderr ?? "";
    this.missing = options.missing ?? [];
  }
}

/** How an instance's process ended: its exit code, or the signal that ended it. */
export interface InstanceExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

/**
 * A start that failed once the runtime was up (the image's share): `message` says how the
 * instance ended and the error line it printed, with no host path (a user reads it as the
 * `stateReason`); `stderr` holds its last lines for the host's log.
 */
export class MicrovmStartFailed extends MicrovmProviderError {
  /** How its process ended by itself; undefined when it was stopped (a deadline, an abort). */
  readonly exit: InstanceExit | undefined;
  readonly stderr: string;
  constructor(message: string, options: { cause?: unknown; exit: InstanceExit | undefined; stderr: string }) {
    super(message, { cause: options.cause });
    this.name = "MicrovmStartFailed";
    this.exit = options.exit;
    this.stderr = options.stderr;
  }
}

/** The `MicrovmStartFailed` in `err`'s cause chain, if any. */
export function startFailureOf(err: unknown): MicrovmStartFailed | undefined {
  return causeOfType(err, MicrovmStartFailed);
}

/** The image did not answer its readiness probe within `MicrovmSpec.imageTimeoutMs` of its runtime's boot. */
export class MicrovmImageTimeout extends MicrovmProviderError {
  constructor(
    readonly timeoutMs: number,
    options?: { cause?: unknown },
  ) {
    super(`the image did not answer its readiness probe within ${timeoutMs} ms of its runtime's start`, options);
    this.name = "MicrovmImageTimeout";
  }
}

/** Whether `err`'s cause chain holds a `MicrovmImageTimeout`. */
export function imageTimedOut(err: unknown): boolean {
  return causeOfType(err, MicrovmImageTimeout) !== undefined;
}

/** The `MicrovmHostError` in `err`'s cause chain, if any. */
export function hostFailureOf(err: unknown): MicrovmHostError | undefined {
  return causeOfType(err, MicrovmHostError);
}

/** The first error of class `type` in `err`'s cause chain (`err` itself included). */
function causeOfType<E extends Error>(err: unknown, type: abstract new (...args: never[]) => E): E | undefined {
  for (let cause: unknown = err; cause instanceof Error; cause = cause.cause) {
    if (cause instanceof type) return cause;
  }
  return undefined;
}

/** The real local port behind a virtual one, if the instance maps it. */
export function realPort(handle: MicrovmHandle, virtualPort: number): number | undefined {
  return Object.hasOwn(handle.ports, String(virtualPort)) ? handle.ports[String(virtualPort)] : undefined;
}

/** The upstream of a handle by its fields alone: its socket, else its mapped local port. */
export function upstreamOf(handle: MicrovmHandle, virtualPort: number): Upstream | undefined {
  if (handle.socketPath !== undefined) {
    const headers: Record<string, string> =
      virtualPort === RUNTIME_PORT ? {} : { [INSTANCE_PORT_HEADER]: String(virtualPort) };
    return { socketPath: handle.socketPath, headers };
  }
  const port = realPort(handle, virtualPort);
  return port === undefined ? undefined : { host: handle.host, port };
}

// The provider interface: how an instance is isolated, started, frozen and stopped: the
// sandbox (sandbox-provider.ts: namespaces + cgroups) by default, or a plain process group
// (process-provider.ts) for development. A VM provider would implement the same interface.
import { INSTANCE_PORT_HEADER } from "../wire/rpc.ts";
import type { Upstream } from "../wire/forward.ts";

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
  /** Freezes the instance; resolves once it is frozen. */
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
  exited?(handle: MicrovmHandle): Promise<string>;
  /** Where a request for `virtualPort` goes now; undefined when the instance cannot take it. */
  upstream?(handle: MicrovmHandle, virtualPort: number): Upstream | undefined;
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

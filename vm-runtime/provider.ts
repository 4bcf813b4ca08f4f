// The provider interface: how an instance is isolated, started, frozen and stopped. The
// default is a process group (process-provider.ts); a Firecracker/QEMU provider fits the same.

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

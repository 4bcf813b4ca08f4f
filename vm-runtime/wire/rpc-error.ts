// The error a client call rejects with: the remote error's `_tag` and fields from the RPC
// envelope, a proxy refusal (403, 409, 502 ...), or a stream that failed part-way.
import type { RpcErrorBody } from "./rpc.ts";

/** Where the failure came from (`api`: the microVM API refused an object's call). */
export type RpcFailureSource = "rpc" | "stream" | "proxy" | "api" | "http";

export class MicrovmRpcError<E extends RpcErrorBody = RpcErrorBody> extends Error {
  /** `_tag` of the remote error (or of the proxy's answer); undefined for an untagged throw. */
  readonly _tag: string | undefined;
  readonly status: number;
  readonly source: RpcFailureSource;
  /** The decoded error object: every field the remote error carried. */
  readonly error: E;

  constructor(init: { source: RpcFailureSource; status: number; error: E }) {
    super(init.error.message);
    this.name = "MicrovmRpcError";
    this._tag = init.error._tag;
    this.status = init.status;
    this.source = init.source;
    this.error = init.error;
  }
}

/** Narrows an unknown rejection to a MicrovmRpcError with the given `_tag`. */
export function isRpcError<E extends RpcErrorBody = RpcErrorBody>(
  value: unknown,
  tag?: string,
): value is MicrovmRpcError<E> {
  return value instanceof MicrovmRpcError && (tag === undefined || value._tag === tag);
}

// The error every client call rejects with: the HTTP status (or its NATS equivalent) and the body.
import type { ErrorOf, Operation } from "../schemas/index.ts";

/** Errors any call may reject with besides the operation's declared ones. */
export type TransportErrorTag =
  | "HttpApiDecodeError"
  | "ServiceUnavailable"
  | "GatewayTimeout"
  | "InternalServerError"
  | "IdempotencyKeyReused";

export type ClientErrorBody<Op extends Operation> = ErrorOf<Op> | { _tag: TransportErrorTag; [field: string]: unknown };

/**
 * A failed call: `status` is the HTTP status (or its NATS equivalent), `error` the body; its
 * message is `<_tag> (<status>)`, then `: <the body's message>` when there is one.
 */
export class ClientError<Op extends Operation = Operation> extends Error {
  override readonly name = "ClientError";
  constructor(
    readonly status: number,
    readonly error: ClientErrorBody<Op>,
    options?: { cause?: unknown },
  ) {
    // The body's message too, when it has one: a thrown error printed as it is says why.
    const { _tag, message } = error as { _tag: string; message?: unknown };
    super(`${_tag} (${status})${typeof message === "string" && message ? `: ${message}` : ""}`, options);
  }
  get _tag(): string {
    return (this.error as { _tag: string })._tag;
  }
}

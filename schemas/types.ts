// The shape of a declared operation: one object from which HTTP routes, NATS subjects,
// validators, typed clients and docs are derived.
import type { Static, TObject, TSchema } from "@sinclair/typebox";
import type { ErrorDef } from "./errors.ts";

export type HttpMethod = "GET" | "POST" | "PUT" | "DELETE" | "PATCH";

/** Which HTTP API (listener) serves an operation. */
export type ApiName = "task" | "job" | "microvm";

/** A declared operation. Input is the union of path params, query and payload fields. */
export interface Operation {
  readonly name: string;
  readonly api: ApiName;
  readonly http: { readonly method: HttpMethod; readonly path: string };
  /**
   * NATS subject below the configured prefix. A `{field}` token is filled from the input
   * field of that name (base64url, no padding) and that field leaves the request body.
   */
  readonly subject: string;
  readonly params?: TObject;
  readonly query?: TObject;
  readonly payload?: TObject;
  readonly success: TSchema;
  readonly errors: readonly ErrorDef[];
  /** The write creates a record whose id an `Idempotency-Key` header may fix. */
  readonly idempotent?: boolean;
  readonly summary?: string;
}

type PartOf<S> = S extends TObject ? Static<S> : {};

/** The input of an operation as a caller passes it (all parts merged). */
export type InputOf<Op extends Operation> = PartOf<Op["params"]> &
  PartOf<Op["query"]> &
  PartOf<Op["payload"]>;

/** The success value of an operation. */
export type SuccessOf<Op extends Operation> = Static<Op["success"]>;

/** The body of a declared error of an operation. */
export type ErrorOf<Op extends Operation> = Static<Op["errors"][number]["schema"]>;

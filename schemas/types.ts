// The shape of a declared operation: one object from which HTTP routes, NATS subjects,
// validators, typed clients and docs are derived.
import type { Static, TObject, TSchema } from "@sinclair/typebox";
import type { Answer } from "./answers.ts";
import type { ErrorDef } from "./errors.ts";

export type HttpMethod = "GET" | "POST" | "PUT" | "DELETE" | "PATCH";

/** Which HTTP API (listener) serves an operation. */
export type ApiName = "task" | "job" | "microvm";

/**
 * Which process answers an operation. `stateless`: any actor of the queue group (storage is
 * the only state). `byName`: the process holding the lease of the object that input field
 * `key` names (task objects). `byHost`: the host that launched the record that input field
 * `key` names (microVM instances). An owned operation is also served on each owner's own
 * subjects (`ownerSubject`), where a request that reached another process is forwarded.
 */
export type Placement =
  | { readonly kind: "stateless" }
  | { readonly kind: "byName"; readonly key: string }
  | { readonly kind: "byHost"; readonly key: string };

/** The placements whose operations have owners. */
export type OwnedPlacement = Exclude<Placement, { kind: "stateless" }>;

/**
 * A read that storage alone answers, in any process, without the owner. `immutable`: what it
 * reads never changes once created, so a found answer may be kept forever; `mutable`: it may
 * change (e.g. written by other services), so storage is asked every time; `versioned`: it
 * changes only by revision-checked writes whose every change the bucket publishes, so a found
 * answer may be kept until a change of its record is seen, and sent only while the reader knows
 * it has seen every change up to less than its bound ago (a gateway's `READ_CACHE_STALE_MS`).
 */
export type Reads = "immutable" | "mutable" | "versioned";

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
  /** Which process answers it. */
  readonly placement: Placement;
  /** Set on reads that storage alone answers (see `Reads`); absent: only an actor answers. */
  readonly reads?: Reads;
  readonly params?: TObject;
  readonly query?: TObject;
  readonly payload?: TObject;
  /**
   * Over HTTP the body is this one payload field's value (any JSON: an object call's argument
   * array), not an object of fields; an empty body is the field's default.
   */
  readonly body?: string;
  readonly success: TSchema;
  readonly errors: readonly ErrorDef[];
  /**
   * The write may be repeated under one `Idempotency-Key` (the gateway makes one per HTTP
   * request): a create's key fixes the new record's id; an update's or delete's goes with its
   * write, so a repeat answers that write instead of writing again.
   */
  readonly idempotent?: boolean;
  readonly summary?: string;
  /** Largest request body over HTTP, above the gateway's default (still below NATS max_payload). */
  readonly maxBodyBytes?: number;
  /** Time for the actor's answer when it needs longer than the gateway's default. */
  readonly timeoutMs?: number;
  /**
   * How long a request that waits (RunMicrovm's `wait`, a suspend's checkpoint, a resume's
   * restore) may wait, in ms, added to its time for an answer; such a request is sent once (a
   * second attempt would lose the first's answer).
   */
  readonly waitMsOf?: (input: Record<string, unknown>) => number | undefined;
  /**
   * A read that can be followed over HTTP (`?follow=1`): the gateway answers NDJSON, one object
   * a line (each item of the answer's `items` field), then asks again with `since` set to the
   * answer's `cursor` and `waitSeconds` to this, until the client closes.
   */
  readonly follow?: { readonly items: string; readonly waitSeconds: number };
}

type PartOf<S> = S extends TObject ? Static<S> : {};

/** The input of an operation as a caller passes it (all parts merged). */
export type InputOf<Op extends Operation> = PartOf<Op["params"]> & PartOf<Op["query"]> & PartOf<Op["payload"]>;

/** The success value of an operation. */
export type SuccessOf<Op extends Operation> = Static<Op["success"]>;

/** The body of a declared error of an operation. */
export type ErrorOf<Op extends Operation> = Static<Op["errors"][number]["schema"]>;

/** Operations of `Api` that have owners (placed `byName` or `byHost`). */
export type OwnedOperations<Api extends Record<string, Operation>> = {
  [K in keyof Api as Api[K] extends { readonly placement: OwnedPlacement } ? K : never]: Api[K];
};

/** What a storage read is given. */
export interface StorageReadContext {
  /** Whose records the read may find. */
  readonly principal: string;
}

/**
 * What answers the reads of `Api` from storage alone, by operation key: each one the actor's
 * own read, run where storage is (e.g. in a gateway) without a request context.
 */
export type StorageReads<Api extends Record<string, Operation>> = {
  readonly [K in keyof ReadOperations<Api>]?: (
    input: InputOf<ReadOperations<Api>[K]>,
    context: StorageReadContext,
  ) => Promise<Answer<SuccessOf<ReadOperations<Api>[K]>>>;
};

/** Operations of `Api` that declare `reads`: the only ones a process may answer from storage alone. */
export type ReadOperations<Api extends Record<string, Operation>> = {
  [K in keyof Api as Api[K] extends { readonly reads: Reads } ? K : never]: Api[K];
};

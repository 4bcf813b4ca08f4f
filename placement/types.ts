// What the owner protocol's two sides share with the adapter that serves an API: the context a
// request carries, and the strategy by which a placement finds and reaches the owner of a key.
// A placement owns a key per principal: a task object's name (`byName`), an instance's host
// (`byHost`); a third kind (a user's object: principal, image and name) is one more strategy.
import type { Msg, MsgHdrs } from "@nats-io/transport-node";
import type { Operation, OwnedPlacement } from "../schemas/index.ts";

/** What a handler knows besides its input. */
export interface HandlerContext {
  /** A uuid v4 the caller chose for the record it creates (`Idempotency-Key` header). */
  readonly idempotencyKey?: string;
  /**
   * `idempotencyKey` was made for this request alone (by its sender or here), never chosen by a
   * caller, and nothing of this request may have been written yet (`KEY_FRESH_HEADER`). Whoever
   * tries the request again after an attempt that may have written clears it.
   */
  readonly keyFresh?: boolean;
  /** The request's NATS headers, as received (e.g. `X-Request-Id`, for onward requests). */
  readonly headers?: MsgHdrs;
  /**
   * Who asks: from `ServeOptions.principal` (whose records a task, task-object or job operation
   * sees); the anonymous principal where the API's subject names none.
   */
  readonly principal: string;
  /** The revision a write requires (`If-Match`); absent: any. */
  readonly ifMatch?: number;
}

/** The placements whose operations have owners. */
export type OwnedKind = OwnedPlacement["kind"];

/** What the owner of an operation's key holds while it runs a request, per placement. */
export type OwnerStates = { readonly [P in OwnedKind]?: unknown };

/** The placements of `Api`'s owned operations. */
export type OwnedKindsOf<Api extends Record<string, Operation>> = Extract<
  { [K in keyof Api]: Api[K]["placement"]["kind"] }[keyof Api],
  OwnedKind
>;

/** How the owners of one placement are found and reached: the owner side of the protocol. */
export interface OwnerStrategy<State> {
  /** This process as an owner: it serves the owned operations on its own subjects too. */
  readonly ownerId: string;
  /** Queue group of the own subjects (`""`: none). */
  readonly ownQueue: string;
  /** Suffix of the own subjects' endpoint names in discovery (`-owner`, `-host`). */
  readonly endpointSuffix: string;
  /** The caller's principal on the own subjects (default: the API's own `principal`). */
  readonly principal?: (msg: Msg) => string | undefined;
  /**
   * Runs `work` where the key of `op`'s request lives: here, given what the owner holds, or at
   * the owning process, whose answer it relays. `own`: the request came on this process's own
   * subjects. `work` gets the request's context as it stands when it runs (an attempt after one
   * that may have written is no longer `keyFresh`).
   */
  route<T>(
    op: Operation,
    input: Record<string, unknown>,
    context: HandlerContext,
    own: boolean,
    work: (state: State, context: HandlerContext) => Promise<T>,
  ): Promise<T>;
}

/** The owner strategy of every placement `Api` uses: one missing fails to compile. */
export type OwnerStrategies<Api extends Record<string, Operation>, States extends OwnerStates> = {
  readonly [P in OwnedKindsOf<Api>]: OwnerStrategy<P extends keyof States ? States[P] : never>;
};

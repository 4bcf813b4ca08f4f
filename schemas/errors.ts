// The error catalogue: every error an operation can answer, with its stable `_tag`,
// HTTP status and body schema. Handlers throw `ApiError`s made here; adapters encode them.
import { Type, type TSchema, type Static, type TObject } from "@sinclair/typebox";

/** A declared error: `_tag`, HTTP status and the schema of its JSON body. */
export interface ErrorDef<Tag extends string = string, S extends TObject = TObject> {
  readonly tag: Tag;
  readonly status: number;
  readonly schema: S;
}

/** A failure with a declared `_tag`; `body` is exactly what goes on the wire. */
export class ApiError extends Error {
  override readonly name = "ApiError";
  constructor(
    readonly status: number,
    readonly body: { readonly _tag: string } & Record<string, unknown>,
    options?: { cause?: unknown },
  ) {
    // A declared error is an answer, not a bug: capturing its stack only costs time
    // (a 404 is a hot path). The cause, when there is one, keeps its own stack.
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    super(body._tag, options);
    Error.stackTraceLimit = limit;
  }
  get _tag(): string {
    return this.body._tag;
  }
}

/**
 * Every error body has `_tag` and a `message` for people (contract): errors whose fields carry
 * no message of their own get one from `describe`, so no caller can forget it.
 */
function defineError<Tag extends string, P extends Record<string, TSchema>>(
  tag: Tag,
  status: number,
  fields: P,
  describe?: (values: Static<TObject<P>>) => string,
) {
  const schema = Type.Object({ _tag: Type.Literal(tag), ...fields, message: Type.String() });
  const def: ErrorDef<Tag, typeof schema> = { tag, status, schema };
  return Object.assign(def, {
    /** Builds the throwable failure for this error. */
    make(
      values: Omit<Static<typeof schema>, "_tag" | "message"> & { message?: string },
      options?: { cause?: unknown },
    ): ApiError {
      const message = values.message ?? describe?.(values as never) ?? tag;
      return new ApiError(status, { _tag: tag, ...values, message }, options);
    },
  });
}

/** One issue of a decode failure, in the Effect `ArrayFormatter` shape. */
export const DecodeIssue = Type.Object({
  _tag: Type.String({
    description:
      "Missing (a required field is absent) or Type (a value fails its schema); unknown fields are dropped, never " +
      "an issue",
  }),
  path: Type.Array(Type.Union([Type.String(), Type.Number()])),
  message: Type.String(),
});

export const TaskNotFound = defineError("TaskNotFound", 404, { id: Type.String() }, ({ id }) => `no task "${id}"`);
/** `If-Match` named another revision than the record's: `revision` is the record's current one. */
export const PreconditionFailed = defineError(
  "PreconditionFailed",
  412,
  { id: Type.String(), revision: Type.Integer() },
  ({ id, revision }) => `task "${id}" is at revision ${revision}, not the one If-Match names`,
);
export const JobNotFound = defineError("JobNotFound", 404, { id: Type.String() }, ({ id }) => `no job "${id}"`);
export const HttpApiDecodeError = defineError("HttpApiDecodeError", 400, {
  issues: Type.Array(DecodeIssue),
  message: Type.String(),
});
export const IdempotencyKeyReused = defineError("IdempotencyKeyReused", 409, {
  id: Type.String(),
  message: Type.String(),
});
export const MicrovmNotFound = defineError(
  "MicrovmNotFound",
  404,
  { microvmIdentifier: Type.String() },
  ({ microvmIdentifier }) => `no microVM "${microvmIdentifier}" of yours`,
);
export const ImageNotFound = defineError(
  "ImageNotFound",
  404,
  { imageIdentifier: Type.String() },
  ({ imageIdentifier }) => `no image "${imageIdentifier}"`,
);
/** A module that cannot be registered as an image: does not build, load or define an image, or is too large. */
export const InvalidImage = defineError("InvalidImage", 400, {
  message: Type.String(),
  output: Type.Optional(
    Type.Array(Type.String(), {
      maxItems: 20,
      description:
        "a module that did not load: the last lines its instance wrote to stderr, oldest first (file paths " +
        "replaced by <module>)",
    }),
  ),
});
/** The image cannot be deleted: a live instance runs it, or it is built in. */
export const ImageInUse = defineError("ImageInUse", 409, { name: Type.String(), message: Type.String() });
export const InvalidStateTransition = defineError("InvalidStateTransition", 409, {
  microvmId: Type.String(),
  state: Type.String(),
  message: Type.String(),
});
/** RunMicrovm with `wait=running`: the instance was not RUNNING when the wait ran out (it goes on starting). */
export const MicrovmStartTimeout = defineError("MicrovmStartTimeout", 504, {
  microvmId: Type.String(),
  state: Type.String(),
  message: Type.String(),
});
/** RunMicrovm (or the instance checking a pushed image) on a host already running its maximum of live instances. */
export const MicrovmLimitExceeded = defineError("MicrovmLimitExceeded", 429, {
  limit: Type.Integer(),
  message: Type.String(),
});
/** RunMicrovm (or the instance checking a pushed image) by a principal already running its quota of live instances. */
export const MicrovmQuotaExceeded = defineError("MicrovmQuotaExceeded", 429, {
  quota: Type.Integer(),
  message: Type.String(),
});
/** A push past the principal's stored-image quota: `limit` names which (`versions` or `bytes`). */
export const ImageQuotaExceeded = defineError("ImageQuotaExceeded", 429, {
  limit: Type.Union([Type.Literal("versions"), Type.Literal("bytes")]),
  quota: Type.Integer(),
  message: Type.String(),
});
/** A suspend whose snapshot would pass its owner's snapshot quota: refused before the instance is touched. */
export const SnapshotQuotaExceeded = defineError("SnapshotQuotaExceeded", 429, {
  microvmId: Type.String(),
  quota: Type.Integer(),
  message: Type.String(),
});
/** A call of an object whose image is defined with `defineImage`, not `defineObject`. */
export const NotAnObject = defineError(
  "NotAnObject",
  400,
  { image: Type.String() },
  ({ image }) => `image "${image}" is not an object: define it with defineObject to call it as one`,
);
/** One object has more calls waiting than it takes: try again after `retryAfterSeconds`. */
export const ObjectBusy = defineError("ObjectBusy", 429, {
  image: Type.String(),
  name: Type.String(),
  retryAfterSeconds: Type.Integer({ minimum: 1 }),
  message: Type.String(),
});
/**
 * A call that would activate one more of the caller's objects on a host already running its most
 * of them (`limit`), each with a call under way: try again after `retryAfterSeconds`.
 */
export const ObjectLimitExceeded = defineError("ObjectLimitExceeded", 429, {
  limit: Type.Integer(),
  retryAfterSeconds: Type.Integer({ minimum: 1 }),
  message: Type.String(),
});
/** A call of an object that did not answer in its time: its activation was stopped (the next call starts it afresh). */
export const ObjectCallTimeout = defineError("ObjectCallTimeout", 504, { message: Type.String() });
/** No object of yours by that image and name: never called, or deleted. */
export const ObjectNotFound = defineError(
  "ObjectNotFound",
  404,
  { image: Type.String(), name: Type.String() },
  ({ image, name }) => `no object "${name}" of image "${image}" of yours`,
);
/**
 * What an object's method threw, relayed as the RPC wire carries it (any status 400-599, its
 * `error` the thrown value's `_tag`, fields and `message`; never a stack). The tag is the wire's
 * (`RPC_ERROR_TAG` of the runtime); the envelope has no `message` of its own, by that contract.
 */
export const RpcFailure: ErrorDef<"~alchemy/rpc/error"> = {
  tag: "~alchemy/rpc/error",
  status: 500,
  schema: Type.Object({
    _tag: Type.Literal("~alchemy/rpc/error"),
    error: Type.Object({ _tag: Type.Optional(Type.String()), message: Type.String() }),
  }),
};
/**
 * The messages of a 401: no bearer key sent, or one that is not valid. Neither says whose keys
 * exist: a key is looked up by its hash alone.
 */
export const UNAUTHORIZED_MESSAGES = {
  missing: "missing Authorization: Bearer <key> (taskctl: TASKCTL_API_KEY)",
  invalid: "the API key is not valid (sent in Authorization: Bearer <key>)",
  revoked: "the API key (sent in Authorization: Bearer <key>) was removed from the key file while this answer was open",
} as const;
/** No `Authorization: Bearer <key>` naming a known API key (when API keys are on). */
export const Unauthorized = defineError("Unauthorized", 401, {}, () => UNAUTHORIZED_MESSAGES.missing);
/** The `Host` header names none of the API's configured host names. */
export const MisdirectedRequest = defineError("MisdirectedRequest", 421, { message: Type.String() });
export const RouteNotFound = defineError("RouteNotFound", 404, { message: Type.String() });
/** A body (or a POST, on the microVM API) not sent as JSON: one wording for every API. */
export const UnsupportedMediaType = defineError(
  "UnsupportedMediaType",
  415,
  {},
  () => "content-type must be application/json",
);
export const PayloadTooLarge = defineError("PayloadTooLarge", 413, {
  limit: Type.Integer(),
  message: Type.String(),
});
/** The request's headers exceeded the server's limit (Node's parser rejected them). */
export const RequestHeaderFieldsTooLarge = defineError("RequestHeaderFieldsTooLarge", 431, { message: Type.String() });
/** The request's headers or body did not arrive within the server's time bounds. */
export const RequestTimeout = defineError("RequestTimeout", 408, { message: Type.String() });
/**
 * Between actor processes only, never answered to a client: the process asked on its own
 * subject does not hold the task object's lease (any more), so the sender reads it again.
 */
/** One task object has more requests waiting than its owner takes: try again after `retryAfterSeconds`. */
export const TaskObjectBusy = defineError("TaskObjectBusy", 429, {
  name: Type.String(),
  retryAfterSeconds: Type.Integer({ minimum: 1 }),
  message: Type.String(),
});
/** No task object of that name: it stores no task and no process holds its activation. */
export const TaskObjectNotFound = defineError(
  "TaskObjectNotFound",
  404,
  { name: Type.String() },
  ({ name }) => `no task object "${name}": it has no tasks and no activation`,
);
export const NotOwner = defineError("NotOwner", 503, {}, () => "this process does not own the task object");
/**
 * Between a gateway and an actor process only: the name's owner is silent and `process` will
 * claim the name when its lease may be taken (after the caller's time), so send it there to wait.
 */
export const TakeoverPending = defineError(
  "TakeoverPending",
  503,
  { process: Type.String() },
  ({ process }) => `the task object's owner is silent; ${process} takes it over`,
);
/** Never a stack or a cause: what failed is in the service's log, under the request's X-Request-Id. */
export const InternalServerError = defineError(
  "InternalServerError",
  500,
  {},
  () => "internal error: the service's log has the cause (look for this response's X-Request-Id)",
);
export const ServiceUnavailable = defineError(
  "ServiceUnavailable",
  503,
  {},
  () => "the service's actors cannot be reached at the moment: retry after the Retry-After seconds",
);
export const GatewayTimeout = defineError(
  "GatewayTimeout",
  504,
  {},
  () => "the service's actors did not answer in time: the outcome is unknown (a write may have been done)",
);

/** Errors any operation may answer besides its declared ones. */
export const commonErrors = [HttpApiDecodeError, InternalServerError, ServiceUnavailable, GatewayTimeout] as const;

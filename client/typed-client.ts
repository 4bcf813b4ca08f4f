// The typed client both transports share: one method per operation of an API, which checks
// its input against the operation's schema (compiled on the method's first call) and hands it
// to the transport's `call`. A declared error rejects as a `ClientError`.
import { ApiError, type InputOf, type Operation, type SuccessOf } from "../schemas/index.ts";
import { ClientError } from "./client-error.ts";

export interface CallOptions {
  /** Fixes the id of a created record, so retrying the same call never creates two. */
  idempotencyKey?: string;
  /** A write applies only while the record is at this revision, else 412 PreconditionFailed. */
  ifMatch?: number;
  /** Told the revision of the stored record the answer is (HTTP `ETag`, NATS `Revision`). */
  onRevision?: (revision: number) => void;
}

export type Client<Api extends Record<string, Operation>> = {
  [K in keyof Api]: (input: InputOf<Api[K]>, options?: CallOptions) => Promise<SuccessOf<Api[K]>>;
};

/** What every client takes besides its transport's own options. */
export interface ClientOptions {
  /**
   * Check each input here before sending it (default true). `false` leaves it to the service,
   * which checks every request with the same schemas and answers the same 400; the validator
   * (Ajv) is then never loaded: taskctl starts faster so.
   */
  validate?: boolean;
  /**
   * How many times a call refused for now (429 with `retryAfterSeconds`, e.g. TaskObjectBusy:
   * nothing was done) is sent again after the wait it names (default 3; 0 never).
   */
  busyRetries?: number;
}

export type Call = (op: Operation, input: Record<string, unknown>, options?: CallOptions) => Promise<unknown>;

/** A declared error (a decode failure here, an error reply) as the `ClientError` a call rejects with. */
export function asClientError(err: unknown): unknown {
  return err instanceof ApiError ? new ClientError(err.status, err.body as never) : err;
}

/** The wait a refusal asks for before the same call (429 with `retryAfterSeconds`), else undefined. */
function retryAfterMs(err: unknown): number | undefined {
  if (!(err instanceof ClientError) || err.status !== 429) return undefined;
  const seconds = (err.error as { retryAfterSeconds?: unknown }).retryAfterSeconds;
  return typeof seconds === "number" && seconds >= 0 ? Math.min(seconds, 60) * 1000 : undefined;
}

export function makeClient<Api extends Record<string, Operation>>(
  api: Api,
  send: Call,
  { validate = true, busyRetries = 3 }: ClientOptions = {},
): Client<Api> {
  // A refusal that names a wait did nothing: the same call after that wait is safe, and taken.
  const call: Call = async (op, input, options) => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await send(op, input, options);
      } catch (err) {
        const wait = retryAfterMs(err);
        if (wait === undefined || attempt >= busyRetries) throw err;
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  };
  const client: Record<string, unknown> = {};
  for (const [key, op] of Object.entries(api)) {
    let decode: ((value: unknown) => Record<string, unknown>) | undefined;
    client[key] = async (input: Record<string, unknown>, options?: CallOptions) => {
      if (!validate) return call(op, { ...input }, options);
      // Compiled on first use: a client of a whole API mostly calls one or two of its operations.
      decode ??= await inputDecoder(op);
      let decoded: Record<string, unknown>;
      try {
        decoded = decode({ ...input });
      } catch (err) {
        throw asClientError(err);
      }
      return call(op, decoded, options);
    };
  }
  return client as Client<Api>;
}

async function inputDecoder(op: Operation): Promise<(value: unknown) => Record<string, unknown>> {
  const { compileDecoder, inputSchema } = await import("./input-decoder.ts");
  return compileDecoder(inputSchema(op));
}

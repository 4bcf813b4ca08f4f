// The typed client straight over NATS (no HTTP hop): the operations' subjects, bodies and the
// NATS micro error headers.
import { headers as natsHeaders, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import {
  ERROR_CODE_HEADER,
  IDEMPOTENCY_KEY_HEADER,
  IF_MATCH_HEADER,
  REVISION_HEADER,
  replyValue,
  requestBody,
  requestSubject,
  type Operation,
} from "../schemas/index.ts";
import { ClientError } from "./client-error.ts";
import { asClientError, makeClient, type Client, type ClientOptions } from "./typed-client.ts";

export interface NatsClientOptions extends ClientOptions {
  /** Subject prefix (NATS_SUBJECT_PREFIX of the service). */
  prefix?: string;
  /** Request timeout (ms), plus the time the operation was asked to wait. */
  timeoutMs?: number;
}

/** A client that calls the actors straight over NATS. */
export function natsClient<Api extends Record<string, Operation>>(
  api: Api,
  nc: NatsConnection,
  { prefix = "", timeoutMs = 5_000, ...options }: NatsClientOptions = {},
): Client<Api> {
  return makeClient(
    api,
    async (op, input, callOptions) => {
      const h = natsHeaders();
      if (callOptions?.idempotencyKey) h.set(IDEMPOTENCY_KEY_HEADER, callOptions.idempotencyKey);
      if (callOptions?.ifMatch !== undefined) h.set(IF_MATCH_HEADER, String(callOptions.ifMatch));
      let reply;
      try {
        reply = await nc.request(requestSubject(op, input, prefix), requestBody(op, input), {
          timeout: Math.max(timeoutMs, op.timeoutMs ?? 0) + (op.waitMsOf?.(input) ?? 0),
          headers: h,
        });
      } catch (cause) {
        const timeout = cause instanceof TimeoutError;
        throw new ClientError(
          timeout ? 504 : 503,
          timeout
            ? { _tag: "GatewayTimeout", message: "no answer over NATS in time: the outcome is unknown" }
            : { _tag: "ServiceUnavailable", message: `NATS request failed: ${(cause as Error).message}` },
          { cause },
        );
      }
      const revision = reply.headers?.get(REVISION_HEADER);
      if (revision && !reply.headers?.get(ERROR_CODE_HEADER)) callOptions?.onRevision?.(Number(revision));
      try {
        return replyValue(reply);
      } catch (err) {
        throw asClientError(err);
      }
    },
    options,
  );
}

// Operation replies over NATS (the NATS micro convention): the one encoder of error headers
// (the decoder is `replyOf`/`replyValue` in schemas), and transport failures told apart by class.
import {
  ClosedConnectionError,
  ConnectionError,
  DrainingConnectionError,
  headers,
  NoRespondersError as NatsNoRespondersError,
  RequestError,
  TimeoutError,
  type MsgHdrs,
} from "@nats-io/transport-node";
import { ERROR_CODE_HEADER, ERROR_TAG_HEADER, type ApiError } from "../schemas/index.ts";
import { DisconnectedError, NoRespondersError, RequestTimeoutError } from "./requester.ts";

/** The NATS micro error headers of a failure. */
export function errorHeaders(failure: ApiError): MsgHdrs {
  const h = headers();
  h.set(ERROR_CODE_HEADER, String(failure.status));
  h.set(ERROR_TAG_HEADER, failure._tag);
  return h;
}

/** Nobody answered in time (our requester's or nats.js' timeout): the outcome is unknown. */
export function isTimeout(err: unknown): boolean {
  return err instanceof RequestTimeoutError || err instanceof TimeoutError;
}

/** Nobody subscribes to the subject (as our requester or nats.js, bare or as a request's cause, says). */
export function isNoResponders(err: unknown): boolean {
  return (
    err instanceof NoRespondersError ||
    err instanceof NatsNoRespondersError ||
    (err instanceof RequestError && err.isNoResponders())
  );
}

/**
 * The transport failed, not the request: a timeout, no responders, or a connection lost,
 * closed or draining. Storage behind such a failure is unavailable, not broken.
 */
export function isTransportFailure(err: unknown): boolean {
  return (
    isTimeout(err) ||
    isNoResponders(err) ||
    err instanceof DisconnectedError ||
    err instanceof ConnectionError ||
    err instanceof ClosedConnectionError ||
    err instanceof DrainingConnectionError
  );
}

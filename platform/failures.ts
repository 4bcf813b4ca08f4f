// Any failure of an operation as the `ApiError` it answers: declared errors as they are,
// storage trouble (full, or unreachable) as 503, anything else logged and a bare 500.
import { ApiError, InternalServerError, ServiceUnavailable, type Operation } from "../schemas/index.ts";
import { log } from "./log.ts";
import { JetStreamRequestError } from "./record-store.ts";
import { isTransportFailure } from "./replies.ts";

/**
 * JetStream could not store a write for lack of space: the disk is full (ENOSPC) or the
 * server's JetStream storage limit is reached (insufficient resources).
 */
const STORAGE_FULL = /no space left on device|insufficient (storage )?resources/i;
const STORAGE_FULL_LOG_EVERY_MS = 10_000;
let storageFullLoggedAt = -Infinity;
let storageFullSince = 0;

/** One error line per 10 s while JetStream's store is full, with the count meanwhile. */
function logStorageFull(op: Operation, err: JetStreamRequestError): void {
  storageFullSince++;
  const now = Date.now();
  if (now - storageFullLoggedAt < STORAGE_FULL_LOG_EVERY_MS) return;
  storageFullLoggedAt = now;
  log.error(
    { op: op.name, cause: err.message, failedWritesSinceLastLine: storageFullSince },
    "storage full: JetStream cannot store writes (no space); creates answer 503 until space returns",
  );
  storageFullSince = 0;
}

/** A declared error as it is; storage trouble as 503; anything else logged and a bare 500. */
export function toApiError(op: Operation, err: unknown, requestId?: string): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof JetStreamRequestError && STORAGE_FULL.test(err.message)) {
    logStorageFull(op, err);
    return ServiceUnavailable.make({}, { cause: err });
  }
  const storageDown = err instanceof JetStreamRequestError ? err.code >= 500 : isTransportFailure(err);
  if (storageDown) {
    // JetStream's own code and text say which trouble (no leader, no quorum, a timeout).
    const jetstream = err instanceof JetStreamRequestError ? { errCode: err.errCode, cause: err.message } : {};
    log.warn({ op: op.name, requestId, err: (err as Error).name, ...jetstream }, "storage unavailable");
    return ServiceUnavailable.make({}, { cause: err });
  }
  log.error({ op: op.name, requestId, err }, "undeclared failure");
  return InternalServerError.make({}, { cause: err });
}

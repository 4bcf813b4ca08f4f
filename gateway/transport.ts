// Forwarding a request to the actors over NATS, mapping transport trouble to 503 / 504.
import { headers as natsHeaders } from "@nats-io/transport-node";
import { ERROR_CODE_HEADER, GatewayTimeout, ServiceUnavailable } from "../schemas/index.ts";
import type { NatsHandle } from "../platform/index.ts";

/** An actor's answer: HTTP status and the JSON bytes to send as they are. */
export interface ActorReply {
  status: number;
  data: Uint8Array;
}

export interface ForwardOptions {
  /** Total time for the request, retries included. */
  timeoutMs: number;
  /** Headers to send (e.g. `Idempotency-Key`). */
  headers?: Record<string, string>;
}

const NO_RESPONDERS_RETRY_MS = 100;
/** How long "no responders" is retried before answering 503 (actors restarting). */
const NO_RESPONDERS_WAIT_MS = 1_000;

/**
 * Sends one request. Not connected → 503 at once (the client would drop it). No responders
 * (actors restarting) → retried for a short while, then 503. Timeout → 504: the outcome is
 * unknown, which is safe because creates carry an idempotency key.
 */
export async function forward(
  nats: NatsHandle,
  subject: string,
  body: string,
  options: ForwardOptions,
): Promise<ActorReply> {
  const start = Date.now();
  const deadline = start + options.timeoutMs;
  const retryUntil = Math.min(deadline, start + NO_RESPONDERS_WAIT_MS);
  const h = options.headers ? natsHeaders() : undefined;
  for (const [k, v] of Object.entries(options.headers ?? {})) h!.set(k, v);
  for (;;) {
    if (!nats.connected()) throw ServiceUnavailable.make({});
    const remaining = deadline - Date.now();
    try {
      const msg = await nats.nc.request(subject, body, { timeout: Math.max(remaining, 1), headers: h });
      const code = msg.headers?.get(ERROR_CODE_HEADER);
      return { status: code ? Number(code) : 200, data: msg.data };
    } catch (err) {
      const name = (err as Error).name;
      const noResponders = name === "NoRespondersError" ||
        (err as { isNoResponders?: () => boolean }).isNoResponders?.() === true;
      if (noResponders && Date.now() + NO_RESPONDERS_RETRY_MS < retryUntil) {
        await new Promise((r) => setTimeout(r, NO_RESPONDERS_RETRY_MS));
        continue;
      }
      if (name === "TimeoutError") throw GatewayTimeout.make({}, { cause: err });
      throw ServiceUnavailable.make({}, { cause: err });
    }
  }
}

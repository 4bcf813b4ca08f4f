// Requests an actor holds open (a long poll) end when their HTTP client goes away, both sides of
// it here. The gateway sends such a request with a `Held-Request` id; when its client closes
// before the answer, the gateway gives up on it and publishes the id on
// `microvms.gateway.cancel`, which only the gateway may publish and every host hears (no queue
// group: whichever took the request). That host aborts the wait held for the id, releasing what
// it holds (a subscription). A NATS caller sends no id: its wait ends at its own bound.
import { randomUUID } from "node:crypto";
import type { MsgHdrs, NatsConnection, Subscription } from "@nats-io/transport-node";
import { LRUCache } from "lru-cache";
import { withPrefix } from "../schemas/index.ts";
import { log } from "./log.ts";

/** Request header: the id under which the gateway may cancel the request. */
export const HELD_REQUEST_HEADER = "Held-Request";

/** Where the gateway says which held requests were abandoned (the body is the id). */
export const heldCancelSubject = (prefix = "") => withPrefix(prefix, "microvms.gateway.cancel");

/**
 * The gateway's half: marks the request whose headers are `h` as held, and tells the hosts
 * when `signal` aborts (its client left). Returns the function that stops listening, to call
 * once the request is answered.
 */
export function holdRequest(nc: NatsConnection, prefix: string, h: MsgHdrs, signal: AbortSignal): () => void {
  const id = randomUUID();
  h.set(HELD_REQUEST_HEADER, id);
  const cancel = () => {
    try {
      nc.publish(heldCancelSubject(prefix), id);
    } catch (err) {
      // The connection is closed or closing: the host's wait then ends at its own bound.
      log.debug({ err }, "a held request's cancel was not sent");
    }
  };
  signal.addEventListener("abort", cancel, { once: true });
  return () => signal.removeEventListener("abort", cancel);
}

/** How long a cancel that came before its request's wait began is remembered. */
const EARLY_CANCEL_MS = 60_000;

/** The host's half: the waits held for the gateway, by id, each ended by its cancel. */
export class HeldRequests {
  readonly #waits = new Map<string, AbortController>();
  /** Cancels whose wait had not begun (the request still being checked): it begins aborted. */
  readonly #early = new LRUCache<string, true>({ max: 4_096, ttl: EARLY_CANCEL_MS });
  readonly #sub: Subscription;

  constructor(nc: NatsConnection, prefix = "") {
    this.#sub = nc.subscribe(heldCancelSubject(prefix), {
      callback: (_err, msg) => {
        const id = msg.string();
        const wait = this.#waits.get(id);
        if (wait) wait.abort();
        else if (id) this.#early.set(id, true);
      },
    });
  }

  /**
   * Runs `work` with a signal that aborts when the gateway says the request's client left;
   * a request without an id (not from the gateway, or not held) gets none.
   */
  async hold<T>(headers: MsgHdrs | undefined, work: (signal?: AbortSignal) => Promise<T>): Promise<T> {
    const id = headers?.get(HELD_REQUEST_HEADER);
    if (!id) return work();
    const wait = new AbortController();
    if (this.#early.delete(id)) wait.abort();
    this.#waits.set(id, wait);
    try {
      return await work(wait.signal);
    } finally {
      this.#waits.delete(id);
    }
  }

  close(): void {
    this.#sub.unsubscribe();
    for (const wait of this.#waits.values()) wait.abort();
  }
}

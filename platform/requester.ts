// Request/reply over one wildcard inbox subscription. nats.js' own `request` builds an Error
// (with a stack) for every successful request and `kv.get` adds more on top; in profiles
// that was most of the gateway's CPU. Errors here are built only for failures.
import { createInbox, type Msg, type MsgHdrs, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { BatchPublisher } from "./batch.ts";

/** The request got no reply in time: the outcome is unknown. */
export class RequestTimeoutError extends Error {
  override readonly name = "TimeoutError";
}
/** Nobody subscribes to the subject (the server said so at once). */
export class NoRespondersError extends Error {
  override readonly name = "NoRespondersError";
}
/** The connection dropped while the request waited: the outcome is unknown. */
export class DisconnectedError extends Error {
  override readonly name = "DisconnectedError";
}
/** The caller gave up on the request (its signal aborted): a reply, if one comes, is dropped. */
export class RequestAbortedError extends Error {
  override readonly name = "AbortError";
}

interface Pending {
  resolve(msg: Msg): void;
  reject(err: Error): void;
  deadline: number;
  /** For a request of several replies: true when `msg` is the last one. */
  last?(msg: Msg): boolean;
}

const SWEEP_MS = 25;

export class Requester {
  readonly #publisher: BatchPublisher;
  readonly #prefix: string;
  readonly #pending = new Map<string, Pending>();
  readonly #sub: Subscription;
  #next = 0;
  #sweeper: NodeJS.Timeout | undefined;

  constructor(nc: NatsConnection, publisher = new BatchPublisher(nc)) {
    this.#publisher = publisher;
    // The connection's inbox prefix: a user may subscribe only its own inboxes.
    this.#prefix = `${createInbox((nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix)}.`;
    this.#sub = nc.subscribe(`${this.#prefix}*`, {
      callback: (_err, msg) => {
        const token = msg.subject.slice(this.#prefix.length);
        const pending = this.#pending.get(token);
        if (!pending) return; // late reply to a request that timed out
        if (msg.data.length === 0 && msg.headers?.code === 503) {
          this.#pending.delete(token);
          pending.reject(new NoRespondersError(msg.subject));
        } else if (pending.last === undefined || pending.last(msg)) {
          this.#pending.delete(token);
          pending.resolve(msg);
        }
      },
    });
  }

  /** Sends `data` to `subject` and resolves with the reply; `signal` gives up on it early. */
  request(
    subject: string,
    data: Uint8Array | string | undefined,
    timeoutMs: number,
    headers?: MsgHdrs,
    signal?: AbortSignal,
  ): Promise<Msg> {
    return this.requestMany(subject, data, timeoutMs, undefined, headers, signal);
  }

  /** Requests waiting for their reply. */
  get waiting(): number {
    return this.#pending.size;
  }

  /**
   * Sends `data` to `subject` and hands each reply to `last` until it returns true; resolves
   * with that last reply. All of them must come within `timeoutMs`.
   */
  requestMany(
    subject: string,
    data: Uint8Array | string | undefined,
    timeoutMs: number,
    last: ((msg: Msg) => boolean) | undefined,
    headers?: MsgHdrs,
    signal?: AbortSignal,
  ): Promise<Msg> {
    if (signal?.aborted) return Promise.reject(new RequestAbortedError("request given up before it was sent"));
    return new Promise((resolve, reject) => {
      const token = (this.#next++).toString(36);
      const pending: Pending = { resolve, reject, deadline: Date.now() + timeoutMs };
      if (last) pending.last = last;
      if (signal) {
        const abort = () => {
          if (this.#pending.delete(token)) reject(new RequestAbortedError("request given up"));
        };
        signal.addEventListener("abort", abort, { once: true });
        const settle = (then: () => void) => {
          signal.removeEventListener("abort", abort);
          then();
        };
        pending.resolve = (msg) => settle(() => resolve(msg));
        pending.reject = (err) => settle(() => reject(err));
      }
      this.#pending.set(token, pending);
      this.#sweeper ??= setInterval(() => this.#sweep(), SWEEP_MS).unref();
      this.#publisher.publish({
        subject,
        data,
        reply: this.#prefix + token,
        headers,
        onError: (err) => {
          this.#pending.delete(token);
          pending.reject(err);
        },
      });
    });
  }

  /** Runs `fn` at the end of this turn, just before the turn's requests go out. */
  beforeFlush(fn: () => void): void {
    this.#publisher.beforeFlush(fn);
  }

  /** Fails every waiting request: their replies can no longer arrive. */
  failAll(err: Error): void {
    for (const pending of this.#pending.values()) pending.reject(err);
    this.#pending.clear();
  }

  close(): void {
    clearInterval(this.#sweeper);
    this.failAll(new DisconnectedError("requester closed"));
    this.#sub.unsubscribe();
  }

  #sweep(): void {
    if (this.#pending.size === 0) return;
    const now = Date.now();
    for (const [token, pending] of this.#pending) {
      if (pending.deadline > now) continue;
      this.#pending.delete(token);
      pending.reject(new RequestTimeoutError("no reply in time"));
    }
  }
}

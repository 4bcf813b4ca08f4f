// Publishes gathered for one event-loop turn and handed to nats.js together, so they leave
// in one socket write. nats.js flushes per microtask: under load each request, KV write and
// reply otherwise cost a write syscall of its own (a quarter of the service's CPU).
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";

interface Outgoing {
  subject: string;
  data: Uint8Array | string | undefined;
  reply?: string;
  headers?: MsgHdrs;
  onError?: (err: Error) => void;
}

export class BatchPublisher {
  readonly #nc: NatsConnection;
  #queue: Outgoing[] = [];
  #before: (() => void)[] = [];
  #scheduled = false;

  constructor(nc: NatsConnection) {
    this.#nc = nc;
  }

  /** Queues a publish for the end of this turn; `onError` hears if nats.js refuses it. */
  publish(message: Outgoing): void {
    this.#queue.push(message);
    this.#schedule();
  }

  /**
   * Runs `fn` at the end of this turn, just before the queued publishes go out: what it
   * publishes leaves with them (a request gathered over the turn, such as a batch of reads).
   */
  beforeFlush(fn: () => void): void {
    this.#before.push(fn);
    this.#schedule();
  }

  #schedule(): void {
    if (!this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => this.flush());
    }
  }

  /** Hands every queued publish to nats.js now. */
  flush(): void {
    const before = this.#before;
    this.#before = [];
    for (const fn of before) fn();
    this.#scheduled = false;
    const queue = this.#queue;
    this.#queue = [];
    for (const m of queue) {
      try {
        this.#nc.publish(m.subject, m.data, { reply: m.reply, headers: m.headers });
      } catch (err) {
        m.onError?.(err as Error);
      }
    }
  }
}

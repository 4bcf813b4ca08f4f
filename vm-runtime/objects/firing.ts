// The firing side of alarms: the microVM hosts share one durable pull consumer of due alarms
// (made by the provisioning step); each due alarm is handed to `handler(objectKey)` (activate the
// object, run its `alarm`), acked when it returns, retried after a backoff when it throws, and
// given up (logged, removed) after a bounded number of attempts. At least once: a host that dies
// mid-alarm leaves it unacked, and the consumer hands it to another after the ack wait.
import { jetstream, type JsMsg } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  ALARM_ACK_WAIT_MS,
  ALARM_MAX_DELIVER,
  log,
  OBJECT_ALARMS_CONSUMER,
  OBJECT_ALARMS_STREAM,
} from "../../platform/index.ts";

/** Runs an object's alarm; a throw retries it. */
export type AlarmHandler = (objectKey: string) => Promise<void>;

/** Waits before the 2nd, 3rd, … attempts of an alarm whose handler threw (the last repeats). */
export const DEFAULT_ALARM_BACKOFF_MS = [1_000, 5_000, 30_000, 120_000, 600_000] as const;
/** Attempts of one alarm before it is given up. */
export const DEFAULT_ALARM_ATTEMPTS = 6;

export interface AlarmFiringOptions {
  backoffMs?: readonly number[];
  /** At most `ALARM_MAX_DELIVER`. */
  attempts?: number;
  /** Alarms run at once by this host. */
  concurrency?: number;
  /** Hears each alarm given up, with its last failure. */
  onGiveUp?: (objectKey: string, err: unknown) => void;
}

export interface AlarmFiring {
  close(): Promise<void>;
}

const FIRE_PREFIX = "objalarm.fire.";

/** Starts taking due alarms from the shared consumer and running them with `handler`. */
export async function startAlarmFiring(
  nc: NatsConnection,
  handler: AlarmHandler,
  options: AlarmFiringOptions = {},
): Promise<AlarmFiring> {
  const backoff = options.backoffMs ?? DEFAULT_ALARM_BACKOFF_MS;
  const attempts = Math.min(options.attempts ?? DEFAULT_ALARM_ATTEMPTS, ALARM_MAX_DELIVER);
  const concurrency = options.concurrency ?? 64;
  const consumer = await jetstream(nc).consumers.get(OBJECT_ALARMS_STREAM, OBJECT_ALARMS_CONSUMER);
  const messages = await consumer.consume({ max_messages: concurrency });
  const running = new Set<Promise<void>>();

  const fire = async (msg: JsMsg) => {
    const key = msg.subject.slice(FIRE_PREFIX.length);
    // A long alarm keeps its claim: the consumer would hand it to another host after the ack wait.
    const working = setInterval(() => msg.working(), ALARM_ACK_WAIT_MS / 3);
    try {
      await handler(key);
      msg.ack();
    } catch (err) {
      const attempt = msg.info.deliveryCount;
      if (attempt >= attempts) {
        log.warn({ object: key, attempts: attempt, err }, "alarm given up: its handler failed every attempt");
        options.onGiveUp?.(key, err);
        msg.term("given up");
      } else {
        msg.nak(backoff[Math.min(attempt - 1, backoff.length - 1)] ?? 0);
      }
    } finally {
      clearInterval(working);
    }
  };

  const loop = (async () => {
    for await (const msg of messages) {
      const run = fire(msg).finally(() => running.delete(run));
      running.add(run);
      if (running.size >= concurrency) await Promise.race(running);
    }
  })();

  return {
    async close() {
      await messages.close();
      await loop;
      await Promise.allSettled(running);
    },
  };
}

// Alarms (`ctx.setAlarm/getAlarm/deleteAlarm`): one JetStream message schedule per object
// (`Nats-Schedule: @at <time>` on the object's schedule subject, nats-server 2.12+), which the
// server turns into a firing message at its time, durably and whatever host is up then. A new
// schedule replaces the object's last (one message per subject); a delete purges both subjects.
import { headers } from "@nats-io/transport-node";
import { directGets, JetStreamRequestError, OBJECT_ALARMS_STREAM, type Requester } from "../../platform/index.ts";
import { invalidAlarm, tooManyAlarms } from "./errors.ts";
import { alarmFireSubject, alarmScheduleSubject, objectKey, principalAlarmSchedules, type ObjectRef } from "./keys.ts";
import { readPage } from "./pages.ts";

/** Alarms one principal's objects may have set at once (default). */
export const DEFAULT_MAX_ALARMS = 10_000;
/**
 * The soonest an alarm fires after it is set (default): an object setting alarms in a loop fires at most this often.
 */
export const DEFAULT_MIN_ALARM_INTERVAL_MS = 1_000;

export interface AlarmOptions {
  maxPerPrincipal?: number;
  minIntervalMs?: number;
  timeoutMs?: number;
  /** Epoch ms now (tests). */
  now?: () => number;
}

export interface ObjectAlarms {
  /** Sets (or moves) the object's alarm; resolves with the time it fires at (no sooner than the minimum interval). */
  set(object: ObjectRef, epochMs: number): Promise<number>;
  /** When the object's alarm fires, or null when none is set (one firing now counts as none). */
  get(object: ObjectRef): Promise<number | null>;
  delete(object: ObjectRef): Promise<void>;
}

interface JsReply {
  seq?: number;
  error?: { code: number; err_code: number; description: string };
}

export function objectAlarms(requester: Requester, options: AlarmOptions = {}): ObjectAlarms {
  const timeout = options.timeoutMs ?? 5_000;
  const maxAlarms = options.maxPerPrincipal ?? DEFAULT_MAX_ALARMS;
  const minInterval = options.minIntervalMs ?? DEFAULT_MIN_ALARM_INTERVAL_MS;
  const now = options.now ?? Date.now;
  const directGet = directGets(requester, OBJECT_ALARMS_STREAM, timeout);

  const scheduled = async (key: string): Promise<number | null> => {
    const msg = await directGet(alarmScheduleSubject(key));
    const at = msg?.headers?.get("Nats-Schedule").replace(/^@at /, "");
    return at ? Date.parse(at) : null;
  };
  const count = async (principal: string): Promise<number> => {
    const page = await readPage(requester, OBJECT_ALARMS_STREAM, principalAlarmSchedules(principal), 0, 1, timeout);
    return page.messages.length + page.pending;
  };
  const failed = (reply: JsReply) => {
    if (reply.error) throw new JetStreamRequestError(reply.error.code, reply.error.err_code, reply.error.description);
  };

  return {
    async set(object, epochMs) {
      if (typeof epochMs !== "number" || !Number.isFinite(epochMs))
        throw invalidAlarm(`an alarm's time is epoch milliseconds, a finite number; got ${String(epochMs)}`);
      const key = objectKey(object);
      // Only a new alarm adds to the principal's: moving one replaces it.
      if ((await scheduled(key)) === null && (await count(object.principal)) >= maxAlarms)
        throw tooManyAlarms(object.principal, maxAlarms);
      const at = Math.max(Math.ceil(epochMs), now() + minInterval);
      const h = headers();
      h.set("Nats-Schedule", `@at ${new Date(at).toISOString()}`);
      h.set("Nats-Schedule-Target", alarmFireSubject(key));
      failed((await requester.request(alarmScheduleSubject(key), undefined, timeout, h)).json<JsReply>());
      return at;
    },
    get: (object) => scheduled(objectKey(object)),
    async delete(object) {
      const key = objectKey(object);
      const reply = await requester.request(
        `$JS.API.STREAM.PURGE.${OBJECT_ALARMS_STREAM}`,
        JSON.stringify({ filter: `objalarm.*.${key}` }),
        timeout,
      );
      failed(reply.json<JsReply>());
    },
  };
}

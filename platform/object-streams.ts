// The streams of objects (user code with a name): their storage bucket, the per-principal usage
// counters and the alarm schedules with the consumer the microVM hosts share. Made by the
// provisioning step (`provisionObjectStreams`); the hosts only read and write them.
import { AckPolicy, jetstreamManager, RetentionPolicy, type StreamConfig } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";

/**
 * The KV bucket of objects: per object its lease (`<object-key>`) beside its storage keys
 * (`<object-key>.<key-token>`), so a storage write can be conditional on the lease's revision.
 */
export const OBJECTS_BUCKET = "objects";

/** The counter stream of storage bytes per principal (`objusage.<principal-token>`). */
export const OBJECT_USAGE_STREAM = "OBJECT_USAGE";
export const OBJECT_USAGE_SUBJECTS = "objusage.>";

/**
 * The stream of alarms: one schedule per object (`objalarm.sched.<object-key>`), which the
 * server turns into a firing message (`objalarm.fire.<object-key>`) at its time.
 */
export const OBJECT_ALARMS_STREAM = "OBJECT_ALARMS";
export const OBJECT_ALARM_SUBJECTS = "objalarm.>";
/** The durable consumer of firing alarms, shared by the microVM hosts. */
export const OBJECT_ALARMS_CONSUMER = "alarm-firing";
/** Time a host has to run an alarm's handler before it is handed to another (extended while it runs). */
export const ALARM_ACK_WAIT_MS = 30_000;
/** Deliveries of one firing at most (the firing side gives up before, by its own count). */
export const ALARM_MAX_DELIVER = 20;

/** How long a deleted storage key's marker is kept (the shortest per-message TTL). */
const DELETE_MARKER_TTL_MS = 1_000;

/** The streams `provisionObjectStreams` makes: what no running role may create, update or delete. */
export const objectStreams: readonly string[] = [`KV_${OBJECTS_BUCKET}`, OBJECT_USAGE_STREAM, OBJECT_ALARMS_STREAM];

/** The alarm stream: schedules replace each other per object; a fired alarm is removed once acked. */
export function alarmStreamConfig(replicas = 1): Partial<StreamConfig> & { name: string } {
  return {
    name: OBJECT_ALARMS_STREAM,
    subjects: [OBJECT_ALARM_SUBJECTS],
    retention: RetentionPolicy.Workqueue,
    allow_msg_schedules: true,
    max_msgs_per_subject: 1,
    allow_direct: true,
    num_replicas: replicas,
  };
}

/** Makes the object streams and the alarm consumer (ones that exist are kept as they are). */
export async function provisionObjectStreams(nc: NatsConnection, options: { replicas?: number } = {}): Promise<void> {
  const replicas = options.replicas ?? 1;
  await new Kvm(nc).create(OBJECTS_BUCKET, {
    history: 1,
    replicas,
    allow_direct: true,
    markerTTL: DELETE_MARKER_TTL_MS,
  });
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  await jsm.streams.add({
    name: OBJECT_USAGE_STREAM,
    subjects: [OBJECT_USAGE_SUBJECTS],
    allow_msg_counter: true,
    allow_direct: true,
    num_replicas: replicas,
  });
  await jsm.streams.add(alarmStreamConfig(replicas));
  await jsm.consumers.add(OBJECT_ALARMS_STREAM, {
    durable_name: OBJECT_ALARMS_CONSUMER,
    filter_subject: "objalarm.fire.>",
    ack_policy: AckPolicy.Explicit,
    ack_wait: ALARM_ACK_WAIT_MS * 1_000_000,
    max_deliver: ALARM_MAX_DELIVER,
  });
}

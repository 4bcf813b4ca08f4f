// Where an object's things live: its key (`<principal>.<image>.<name>`, each a base64url token),
// its lease and storage keys in the objects bucket, its usage counter and its alarm subjects.
import { nameFromToken, nameToken } from "../../schemas/index.ts";
import { OBJECTS_BUCKET } from "../../platform/index.ts";

/** An object: `(principal, image, name)` has at most one activation in the cluster. */
export interface ObjectRef {
  readonly principal: string;
  readonly image: string;
  readonly name: string;
}

/** The object's key: its lease key in the objects bucket, and the last tokens of its alarm subjects. */
export const objectKey = (object: ObjectRef): string =>
  `${nameToken(object.principal)}.${nameToken(object.image)}.${nameToken(object.name)}`;

/** The object an `objectKey` names; undefined for anything else. */
export function objectOfKey(key: string): ObjectRef | undefined {
  const tokens = key.split(".");
  if (tokens.length !== 3) return undefined;
  const [principal, image, name] = tokens.map(nameFromToken);
  if (principal === undefined || image === undefined || name === undefined) return undefined;
  return { principal, image, name };
}

/**
 * The id the object's output lines are stored under, for every activation of it (an instance's
 * own id is a uuid; an image name has no space, so two objects never share one).
 */
export const objectLogId = (object: ObjectRef): string => `object ${object.image} ${object.name}`;

/** The subject of a key in the objects bucket. */
export const bucketSubject = (key: string): string => `$KV.${OBJECTS_BUCKET}.${key}`;

/** The bucket key of storage key `key` of the object `object` (an `objectKey`). */
export const storageKey = (object: string, key: string): string => `${object}.${nameToken(key)}`;

/** The principal's storage usage counter. */
export const usageSubject = (principal: string): string => `objusage.${nameToken(principal)}`;

/** The subject of the object's alarm schedule (its identity: one per object). */
export const alarmScheduleSubject = (object: string): string => `objalarm.sched.${object}`;

/** The subject the server publishes the object's alarm to when it is due. */
export const alarmFireSubject = (object: string): string => `objalarm.fire.${object}`;

/** Every alarm schedule of `principal`. */
export const principalAlarmSchedules = (principal: string): string => `objalarm.sched.${nameToken(principal)}.>`;

// Public entry of objects (user code with a name), host side: fenced storage with a quota per
// principal, alarms on JetStream message schedules and the consumer that fires them, the
// session with a running activation (calls in; storage and alarm requests out, over its socket),
// a host's activations of objects, the directory of objects and the handlers of the operations.
export { ObjectError } from "./errors.ts";
export { activationFence } from "./fence.ts";
export {
  directoryKey,
  objectDirectory,
  type DirectoryOptions,
  type DirectoryPage,
  type ObjectDirectory,
  type PageRequest,
} from "./directory.ts";
export { eraseObject, type ObjectRemains } from "./deletion.ts";
export { noActivations, objectHandlers, type ObjectHandlers, type ObjectOperationDeps } from "./operations.ts";
export type { ObjectActivations, ObjectAnswer, ObjectItem, ObjectTraits } from "./types.ts";
export { objectKey, objectOfKey, type ObjectRef } from "./keys.ts";
export {
  DEFAULT_LIST_LIMIT,
  DEFAULT_QUOTA_BYTES,
  MAX_LIST_LIMIT,
  MAX_STORAGE_KEY_BYTES,
  MAX_STORAGE_VALUE_BYTES,
  objectStores,
  type ActivationFence,
  type FencingToken,
  type ListOptions,
  type ObjectStorage,
  type ObjectStores,
  type StorageEntry,
  type StorageOptions,
  type StoragePage,
} from "./storage.ts";
export { objectUsageSubject, type StorageUsage } from "./usage.ts";
export {
  DEFAULT_MAX_ALARMS,
  DEFAULT_MIN_ALARM_INTERVAL_MS,
  objectAlarms,
  type AlarmOptions,
  type ObjectAlarms,
} from "./alarms.ts";
export {
  DEFAULT_ALARM_ATTEMPTS,
  DEFAULT_ALARM_BACKOFF_MS,
  startAlarmFiring,
  type AlarmFiring,
  type AlarmFiringOptions,
  type AlarmHandler,
} from "./firing.ts";
export {
  objectTraitsOf,
  openObjectSession,
  type ObjectSession,
  type ObjectSessionOptions,
  type SessionLimits,
} from "./session.ts";
export type { SessionLog } from "./channel-host.ts";
export {
  DEFAULT_CALL_TIMEOUT_MS,
  DEFAULT_MAX_PENDING_CALLS,
  DEFAULT_START_TIMEOUT_MS,
  startObjectActivations,
  type HostObjectActivations,
  type ObjectActivationsOptions,
} from "./activations.ts";
export {
  objectHibernation,
  snapshotIdOf,
  type ObjectHibernation,
  type ObjectHibernationOptions,
} from "./hibernation.ts";
export type { ActivationSession, ObjectImages, OpenSession, SessionRequest } from "./launch.ts";

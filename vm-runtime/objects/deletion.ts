// What deleting an object removes, once its activation stopped: its snapshot, its storage a page at
// a time, its alarm, its log lines and last its directory record, so that a delete cut short leaves the object
// listed and deleting it again goes on. Its holder runs it in the object's mailbox (held.ts).
import type { ObjectAlarms } from "./alarms.ts";
import type { ObjectDirectory } from "./directory.ts";
import type { ObjectHibernation } from "./hibernation.ts";
import { objectLogId, type ObjectRef } from "./keys.ts";
import type { ObjectOutput } from "./launch.ts";
import type { ObjectStores } from "./storage.ts";

/** Where an object's state lives. */
export interface ObjectRemains {
  readonly stores: ObjectStores;
  readonly alarms: ObjectAlarms;
  readonly directory: ObjectDirectory;
  readonly hibernation?: ObjectHibernation;
  /** Where its output lines are stored. */
  readonly output?: ObjectOutput;
}

/**
 * Removes `object`'s state. `fence` runs before each removal and throws once the lease is lost:
 * a holder cut off mid-delete then removes nothing of the object's next activation elsewhere.
 */
export async function eraseObject(
  remains: ObjectRemains,
  object: ObjectRef,
  fence: () => Promise<void>,
): Promise<void> {
  await fence();
  await remains.hibernation?.discard(object);
  do await fence();
  while (!(await remains.stores.purgePage(object)));
  await fence();
  await remains.alarms.delete(object);
  await fence();
  await remains.output?.purge(object.principal, objectLogId(object));
  await fence();
  await remains.directory.remove(object);
}

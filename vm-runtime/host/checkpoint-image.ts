// What a checkpoint image directory holds beside the wall's own files: the facts of the saved
// instance a restore needs (its id, host uid, heap size and access secret, which are in its
// memory anyway), written by the host and read back with a bound and checked field by field.
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";

/** The host's file in a checkpoint image directory. */
export const SAVED_INSTANCE_FILE = "microvm-instance.json";
const SAVED_INSTANCE_LIMIT = 4096;
const FORMAT = 1;

/** The instance a checkpoint image holds. */
export interface SavedInstance {
  readonly microvmId: string;
  /** The host uid it ran as (inside and out: its socket directory is that uid's). */
  readonly uid: number;
  readonly heapMiB: number;
  /** The secret its runtime admits requests with (it is in the saved memory). */
  readonly secret: string;
  /**
   * Its runtime takes CONTROL_LINES on stdin (runtime/boot.ts); a checkpoint
   * without it is of an earlier runtime, told by the checkpoint signal once its wall runs.
   */
  readonly controlLines?: boolean;
}

export async function writeSavedInstance(imageDir: string, saved: SavedInstance): Promise<void> {
  await writeFile(join(imageDir, SAVED_INSTANCE_FILE), JSON.stringify({ format: FORMAT, ...saved }), { mode: 0o600 });
}

/** The saved instance of `imageDir`; throws a plain Error saying what is wrong with it. */
export async function readSavedInstance(imageDir: string): Promise<SavedInstance> {
  const bytes = await readFile(join(imageDir, SAVED_INSTANCE_FILE)).catch((cause: unknown) => {
    throw new Error("the checkpoint image has no instance file", { cause });
  });
  if (bytes.length > SAVED_INSTANCE_LIMIT) throw new Error("the checkpoint's instance file is too large");
  let parsed: Record<string, unknown>;
  try {
    parsed = JSON.parse(bytes.toString("utf8")) as Record<string, unknown>;
  } catch (cause) {
    throw new Error("the checkpoint's instance file is not JSON", { cause });
  }
  const { format, microvmId, uid, heapMiB, secret, controlLines } = parsed;
  if (
    format !== FORMAT ||
    typeof microvmId !== "string" ||
    !Number.isInteger(uid) ||
    !Number.isInteger(heapMiB) ||
    typeof secret !== "string" ||
    (controlLines !== undefined && typeof controlLines !== "boolean")
  )
    throw new Error("the checkpoint's instance file is malformed");
  return {
    microvmId,
    uid: uid as number,
    heapMiB: heapMiB as number,
    secret,
    ...(controlLines === true ? { controlLines } : {}),
  };
}

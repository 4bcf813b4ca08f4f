// A host's claim on its key: `<dir>/<hostKey>.lock`, held with flock(2) for the host's whole
// life. The kernel lets go of it when the host process ends, however it ends (SIGKILL, OOM), and
// a reused pid cannot hold it: a lock that can be taken names a host that is gone. Node has no
// flock, so the `flock` program takes it on an fd the host lends it; the lock belongs to the
// host's open file and stays once the program exits.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { constants } from "node:fs";
import { open, stat, unlink, type FileHandle } from "node:fs/promises";
import { isProcessAlive, readProcStat } from "./proc.ts";

/** What a held lock file says of its holder (read without the lock: a hint, never a proof). */
export interface LockRecord {
  readonly pid: number;
  /** Its start time in clock ticks after boot: a reused pid is another process. */
  readonly startTime: number;
  /** Where its cgroups are, relative to each hierarchy's root. */
  readonly cgroupParent: string;
}

export interface HeldLock {
  readonly path: string;
  /** Removes the file, then lets go: the holder left nothing behind. */
  release(): Promise<void>;
  /** Lets go and keeps the file: something is left for a later sweep to find. */
  abandon(): Promise<void>;
}

const RECORD_BYTES = 4096;
/** flock's exit status when the lock is held by another (`-E`), told apart from its own errors. */
const CONFLICT = 75;

/**
 * Takes `path` for this process (made if missing), waiting up to `waitMs` for another holder
 * (a sweep of a host that is gone; a live host with the same key keeps it and this throws),
 * after telling `onWait`.
 */
export async function claimLock(
  path: string,
  record: Omit<LockRecord, "pid" | "startTime">,
  waitMs: number,
  onWait: () => void,
): Promise<HeldLock> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const handle = await open(path, constants.O_RDWR | constants.O_CREAT, 0o600);
    const take = async () => {
      if (await flock(handle, 0)) return true;
      onWait();
      return flock(handle, Math.max(0, deadline - Date.now()));
    };
    const taken = await take().catch(async (err: unknown) => {
      await handle.close();
      throw err;
    });
    if (!taken) {
      await handle.close();
      throw new Error(`${path} is held by a live process: another host uses this key`);
    }
    // Its last holder may have removed the file meanwhile: a lock on a file no longer there is none.
    if (await stillAt(path, handle)) {
      const own: LockRecord = { pid: process.pid, startTime: readProcStat(process.pid)?.startTime ?? 0, ...record };
      await handle.truncate(0);
      await handle.write(JSON.stringify(own), 0);
      return held(path, handle);
    }
    await handle.close();
  }
}

/**
 * Takes `path` when its holder is gone: undefined when the file is missing or a live process
 * holds it. Its record says first whether its writer still runs, sparing a `flock` for live hosts.
 */
export async function takeAbandoned(path: string): Promise<{ lock: HeldLock; record?: LockRecord } | undefined> {
  const handle = await open(path, constants.O_RDWR).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return undefined;
    throw err;
  });
  if (!handle) return undefined;
  try {
    const record = await readRecord(handle);
    if (record && isProcessAlive(record.pid, record.startTime)) return void (await handle.close());
    if (!(await flock(handle, 0)) || !(await stillAt(path, handle))) return void (await handle.close());
    return { lock: held(path, handle), ...(record ? { record } : {}) };
  } catch (err) {
    await handle.close();
    throw err;
  }
}

function held(path: string, handle: FileHandle): HeldLock {
  return {
    path,
    async release() {
      await unlink(path).catch(() => undefined);
      await handle.close();
    },
    abandon: () => handle.close(),
  };
}

/** flock(2) on `handle`, exclusive: true once taken, false when another holds it past `waitMs`. */
async function flock(handle: FileHandle, waitMs: number): Promise<boolean> {
  const wait = waitMs > 0 ? ["-w", (waitMs / 1000).toFixed(3)] : ["-n"];
  const child = spawn("flock", ["-x", "-E", String(CONFLICT), ...wait, "3"], {
    stdio: ["ignore", "ignore", "pipe", handle.fd],
  });
  let stderr = "";
  child.stderr?.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-1_000)));
  const [code] = (await Promise.race([
    once(child, "exit"),
    once(child, "error").then(([err]) => Promise.reject(err)),
  ])) as [number | null];
  if (code === 0) return true;
  if (code === CONFLICT) return false;
  throw new Error(`flock failed (${code}): ${stderr.trim()}`);
}

/** Whether `path` is still the file `handle` has open. */
async function stillAt(path: string, handle: FileHandle): Promise<boolean> {
  const [now, opened] = await Promise.all([stat(path).catch(() => undefined), handle.stat()]);
  return now !== undefined && now.ino === opened.ino && now.dev === opened.dev;
}

async function readRecord(handle: FileHandle): Promise<LockRecord | undefined> {
  const buffer = Buffer.alloc(RECORD_BYTES);
  const { bytesRead } = await handle.read(buffer, 0, RECORD_BYTES, 0);
  try {
    const record = JSON.parse(buffer.subarray(0, bytesRead).toString()) as Partial<LockRecord>;
    const valid =
      Number.isInteger(record.pid) && Number.isInteger(record.startTime) && typeof record.cgroupParent === "string";
    return valid ? (record as LockRecord) : undefined;
  } catch {
    return undefined; // being written, or not a record: only the lock can tell
  }
}

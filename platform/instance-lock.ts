// One `npm start` per data directory: `DATA_DIR/service.lock` names the running service process
// (pid, start time, URLs). A second start reads it before touching anything and backs off;
// taskctl and the clients read it to find the APIs of the service on their DATA_DIR.
import { randomBytes } from "node:crypto";
import { link, readFile, rename, rm, writeFile } from "node:fs/promises";
import { isProcessAlive, readProcStat } from "./proc.ts";

/** What the lock file holds. */
export interface InstanceRecord {
  pid: number;
  /** The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22): tells a reused pid apart. */
  startTime: number;
  /** The URLs it serves, once it listens. */
  urls: string[];
  /** The base URL of each API, once the gateway listens (absent without the gateway role). */
  apis?: ServiceApis;
}

/** The base URLs of the Task, Job and microVM APIs. */
export interface ServiceApis {
  task: string;
  job: string;
  microvm: string;
}

export interface InstanceLock {
  /** Records the URLs for a later start's "already running at …", and the APIs' for clients. */
  setUrls(urls: string[], apis?: ServiceApis): Promise<void>;
  release(): Promise<void>;
}

/** Thrown by `acquireInstanceLock` when a live service owns the data directory. */
export class AlreadyRunning extends Error {
  override name = "AlreadyRunning";
  constructor(readonly record: InstanceRecord) {
    super(
      record.urls.length > 0
        ? `already running at ${record.urls.join(" ")} (pid ${record.pid})`
        : `already running (pid ${record.pid}, still starting)`,
    );
  }
}

/** True when `record` names a process that still runs (same pid, same start time). */
export async function isLive(record: InstanceRecord): Promise<boolean> {
  return isProcessAlive(record.pid, record.startTime);
}

/**
 * Takes `path` for this process, or throws `AlreadyRunning`. A lock left by a dead process is
 * replaced. The record is written whole to a file of its own and then hard-linked into place
 * (fails if present), so two starts at the same moment cannot both win nor read half a record.
 */
export async function acquireInstanceLock(path: string): Promise<InstanceLock> {
  const own: InstanceRecord = { pid: process.pid, startTime: readProcStat(process.pid)?.startTime ?? 0, urls: [] };
  const write = async () => {
    const tmp = `${path}.${process.pid}.${randomBytes(4).toString("hex")}`;
    await writeFile(tmp, JSON.stringify(own), { mode: 0o600 });
    return tmp;
  };
  const tmp = await write();
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        await link(tmp, path);
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EEXIST" || attempt > 0) throw err;
      }
      const record = await readInstanceRecord(path);
      if (record && (await isLive(record))) throw new AlreadyRunning(record);
      await rm(path, { force: true });
    }
  } finally {
    await rm(tmp, { force: true });
  }
  return {
    async setUrls(urls, apis) {
      own.urls = urls;
      if (apis) own.apis = apis;
      await rename(await write(), path);
    },
    async release() {
      const record = await readInstanceRecord(path);
      if (record?.pid === process.pid) await rm(path, { force: true });
    },
  };
}

/** The record at `path`; undefined when there is none (or not a record). */
export async function readInstanceRecord(path: string): Promise<InstanceRecord | undefined> {
  try {
    const record = JSON.parse(await readFile(path, "utf8")) as InstanceRecord;
    return Number.isInteger(record.pid) ? record : undefined;
  } catch {
    return undefined; // missing or not a record: nobody holds it
  }
}

// The service a local `npm start` runs, as its DATA_DIR tells: `service.lock` names the running
// process and its APIs' URLs, `nats-url` its private NATS. DATA_DIR (default `.data`) is taken relative to the working
// directory, as the service takes it.
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { isLive, readInstanceRecord, type ServiceApis } from "../platform/index.ts";

/** What DATA_DIR says about a local service: its APIs, or why there are none (for a hint). */
export type LocalService =
  | { readonly dataDir: string; readonly apis: ServiceApis }
  | { readonly dataDir: string; readonly apis?: undefined; readonly missing: string };

/** DATA_DIR of `env`, absolute, as `npm start` resolves it. */
export function dataDirOf(env: NodeJS.ProcessEnv): string {
  return resolve(env.DATA_DIR || ".data");
}

/** Reads DATA_DIR/service.lock: the APIs of the live service there, or what is missing. */
export async function localService(env: NodeJS.ProcessEnv): Promise<LocalService> {
  const dataDir = dataDirOf(env);
  const lockFile = join(dataDir, "service.lock");
  const record = await readInstanceRecord(lockFile);
  if (!record) return { dataDir, missing: `${lockFile} missing` };
  if (!(await isLive(record))) return { dataDir, missing: `${lockFile} names pid ${record.pid}, which has exited` };
  if (!record.apis)
    return { dataDir, missing: `the service there (pid ${record.pid}) is still starting or runs no gateway` };
  return { dataDir, apis: record.apis };
}

/** The hint for a missing local service: where taskctl looked, and the fix. */
export function noServiceHint(service: LocalService & { missing: string }): string {
  return (
    `no service found in DATA_DIR=${service.dataDir} (${service.missing}); ` +
    "start it with `npm start`, or set DATA_DIR to its data directory"
  );
}

/** The URL of the private NATS of the `npm start` on DATA_DIR (its `nats-url`), if there is one. */
export async function localNatsUrl(env: NodeJS.ProcessEnv): Promise<string | undefined> {
  return (await readFile(join(dataDirOf(env), "nats-url"), "utf8").catch(() => "")).trim() || undefined;
}

/** Where a local NATS was looked for, and the fix, when `localNatsUrl` found none. */
export function noNatsHint(env: NodeJS.ProcessEnv): string {
  const dataDir = dataDirOf(env);
  return (
    `no service found in DATA_DIR=${dataDir} (${join(dataDir, "nats-url")} missing); ` +
    "start it with `npm start`, or set DATA_DIR to its data directory"
  );
}

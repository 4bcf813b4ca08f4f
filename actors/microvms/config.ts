// Per-host identity and secrets: the host id (default: hostname + data dir), the token
// signing key (MICROVM_TOKEN_SECRET or a random key kept under the data dir, mode 0600), the
// host's work directory (instance bundles; what reconcile recognises) and its lock file.
import { createHash, randomBytes } from "node:crypto";
import { chmod, mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { join, resolve } from "node:path";
import { isProcessAlive, readProcStat } from "../../vm-runtime/index.ts";
import { log } from "../../platform/index.ts";

const KEY_FILE = "microvm-token.key";
const KEY_BYTES = 32;

/** `<hostname>-<8 hex of the data dir>`: stable across restarts, distinct per data dir. */
export function defaultHostId(dataDir: string): string {
  const digest = createHash("sha256").update(resolve(dataDir)).digest("hex").slice(0, 8);
  return `${hostname()}-${digest}`;
}

/** Where this host keeps instance bundles: one directory per host id under the data dir. */
export function hostWorkDir(dataDir: string, hostId: string): string {
  return join(resolve(dataDir), "microvm-hosts", createHash("sha256").update(hostId).digest("hex").slice(0, 16));
}

/**
 * The token signing key: `secret` when given (at least 32 bytes), else the key file under
 * `dataDir`, created with 32 random bytes and mode 0600 on first use. Never logged.
 */
export async function loadTokenKey(dataDir: string, secret?: string): Promise<Buffer> {
  if (secret !== undefined && secret !== "") {
    if (Buffer.byteLength(secret) < KEY_BYTES) throw new Error(`MICROVM_TOKEN_SECRET must be at least ${KEY_BYTES} bytes`);
    return Buffer.from(secret);
  }
  await mkdir(dataDir, { recursive: true });
  const path = join(dataDir, KEY_FILE);
  try {
    await writeFile(path, randomBytes(KEY_BYTES), { mode: 0o600, flag: "wx" });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  if (((await stat(path)).mode & 0o077) !== 0) {
    log.warn({ path }, "token key file was readable by others; mode set to 0600");
    await chmod(path, 0o600);
  }
  const key = await readFile(path);
  if (key.length < KEY_BYTES) throw new Error(`${path} holds fewer than ${KEY_BYTES} bytes`);
  return key;
}

interface LockOwner {
  readonly pid: number;
  readonly startTime: number;
}

/**
 * Takes the host lock in `workDir`: two live processes with one host id would kill each
 * other's instances at start, so the second refuses to run. A lock of a dead process is stale.
 */
export async function lockHost(workDir: string, hostId: string): Promise<() => Promise<void>> {
  await mkdir(workDir, { recursive: true, mode: 0o700 });
  const path = join(workDir, "host.lock");
  const holder = await readFile(path, "utf8").then((text) => JSON.parse(text) as LockOwner, () => undefined);
  if (holder && holder.pid !== process.pid && isProcessAlive(holder.pid, holder.startTime)) {
    throw new Error(`microVM host id "${hostId}" is in use by process ${holder.pid}; set a distinct MICROVM_HOST_ID`);
  }
  const me: LockOwner = { pid: process.pid, startTime: readProcStat(process.pid)?.startTime ?? 0 };
  await writeFile(path, JSON.stringify(me), { mode: 0o600 });
  return () => rm(path, { force: true });
}

// Per-host identity and secrets: the host id (default: hostname + data dir), the token
// signing key (MICROVM_TOKEN_SECRET or a random key kept under the data dir, mode 0600), the
// host's work directory (instance bundles; what reconcile recognises) and its lock file.
import { createHash, randomBytes } from "node:crypto";
import { chmod, mkdir, readFile, stat, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { join, resolve } from "node:path";
import type { TokenKey } from "../wire/token.ts";
import { acquireInstanceLock, AlreadyRunning, log } from "../../platform/index.ts";

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
/**
 * The token keyring: `secret` (else the key file) signs; `previousSecret` (the key before a
 * rotation, `MICROVM_TOKEN_SECRET_PREVIOUS`) still verifies tokens it signed until they expire.
 */
export async function loadTokenKeyring(dataDir: string, secret?: string, previousSecret?: string): Promise<TokenKey> {
  const current = await loadTokenKey(dataDir, secret);
  if (!previousSecret) return current;
  if (Buffer.byteLength(previousSecret) < KEY_BYTES)
    throw new Error(`MICROVM_TOKEN_SECRET_PREVIOUS must be at least ${KEY_BYTES} bytes`);
  return { current, previous: [Buffer.from(previousSecret)] };
}

export async function loadTokenKey(dataDir: string, secret?: string): Promise<Buffer> {
  if (secret !== undefined && secret !== "") {
    if (Buffer.byteLength(secret) < KEY_BYTES)
      throw new Error(`MICROVM_TOKEN_SECRET must be at least ${KEY_BYTES} bytes`);
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

/**
 * One live process per host id (two would kill each other's instances at start): `host.lock`
 * in the host's work directory, taken atomically, so of two hosts starting at the same moment
 * one refuses to run. A lock left by a dead process is replaced.
 */
export async function lockHost(workDir: string, hostId: string): Promise<() => Promise<void>> {
  await mkdir(workDir, { recursive: true, mode: 0o700 });
  try {
    const lock = await acquireInstanceLock(join(workDir, "host.lock"));
    return () => lock.release();
  } catch (err) {
    if (!(err instanceof AlreadyRunning)) throw err;
    throw new Error(
      `microVM host id "${hostId}" is in use by process ${err.record.pid}; set a distinct MICROVM_HOST_ID`,
    );
  }
}

// Which `nats-server` to run, first that exists: `NATS_SERVER_BIN`; the project-local one that
// `scripts/get-nats-server.sh` puts in `.tools/`; `nats-server` on PATH; `/usr/sbin/nats-server`
// (Debian's package, outside a user's PATH). The minimum is 2.12, for its atomic batches and
// `Nats-Expected-Last-Subject-Sequence-Subject` (issue #28): Debian bookworm's 2.9 and trixie's
// 2.10 are refused.
import { execFileSync } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const MIN_NATS_SERVER = [2, 12] as const;

export const GET_NATS_SERVER = "scripts/get-nats-server.sh";

export interface NatsServerBinary {
  /** The binary, as found. */
  readonly path: string;
  /** `[major, minor, patch]`, undefined when `--version` did not answer with one. */
  readonly version: readonly number[] | undefined;
  /** Where it came from. */
  readonly source: "NATS_SERVER_BIN" | "project" | "PATH" | "/usr/sbin";
}

/**
 * The project root: this module sits one level below it both as source (`platform/`) and
 * bundled (`dist/main.mjs`).
 */
const projectRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");

export const projectNatsServer = join(projectRoot, ".tools/nats-server/usr/sbin/nats-server");

const cache = new Map<string, NatsServerBinary | undefined>();

/** The binary to run, undefined when there is none; `env` decides (default `process.env`). */
export function findNatsServer(env: NodeJS.ProcessEnv = process.env): NatsServerBinary | undefined {
  const key = `${env.NATS_SERVER_BIN ?? ""}\0${env.PATH ?? ""}`;
  if (!cache.has(key)) cache.set(key, lookUp(env));
  return cache.get(key);
}

function lookUp(env: NodeJS.ProcessEnv): NatsServerBinary | undefined {
  // A binary named explicitly is the one to run, or an error: never silently another.
  if (env.NATS_SERVER_BIN) {
    const path = env.NATS_SERVER_BIN;
    return { path, source: "NATS_SERVER_BIN", version: executable(path) ? versionOf(path) : undefined };
  }
  const candidates: [string, NatsServerBinary["source"]][] = [
    [projectNatsServer, "project"],
    ...(env.PATH ?? "")
      .split(delimiter)
      .filter(Boolean)
      .map((dir) => [join(dir, "nats-server"), "PATH"] as [string, "PATH"]),
    ["/usr/sbin/nats-server", "/usr/sbin"],
  ];
  for (const [path, source] of candidates) {
    if (!executable(path)) continue;
    return { path, source, version: versionOf(path) };
  }
  return undefined;
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** `nats-server: v2.15.1` → `[2, 15, 1]`. */
export function parseNatsServerVersion(output: string): number[] | undefined {
  const match = /v?(\d+)\.(\d+)\.(\d+)/.exec(output);
  return match ? match.slice(1, 4).map(Number) : undefined;
}

function versionOf(path: string): number[] | undefined {
  try {
    return parseNatsServerVersion(execFileSync(path, ["--version"], { encoding: "utf8", timeout: 10_000 }));
  } catch {
    return undefined;
  }
}

export function recentEnough(version: readonly number[] | undefined): boolean {
  if (!version) return false;
  const [major, minor] = version;
  return major > MIN_NATS_SERVER[0] || (major === MIN_NATS_SERVER[0] && minor >= MIN_NATS_SERVER[1]);
}

/**
 * The path of a nats-server >= `MIN_NATS_SERVER`, or an error whose one-line message says what
 * was found and how to get a current one.
 */
export function natsServerPath(env: NodeJS.ProcessEnv = process.env): string {
  const found = findNatsServer(env);
  const need = `nats-server >= ${MIN_NATS_SERVER.join(".")} is needed`;
  const script = `run ${GET_NATS_SERVER} (Debian unstable's package into .tools/)`;
  const how = `${script}, or set NATS_SERVER_BIN to a current binary`;
  if (!found) throw new Error(`${need} and none was found (NATS_SERVER_BIN, .tools/, PATH, /usr/sbin): ${how}`);
  if (found.source === "NATS_SERVER_BIN" && !executable(found.path)) {
    throw new Error(
      `NATS_SERVER_BIN names ${found.path}, which is not an executable file: ${script}, or point it at a current ` +
        `binary`,
    );
  }
  if (!recentEnough(found.version)) {
    const version = found.version ? `v${found.version.join(".")}` : "a version it did not report";
    throw new Error(`${need}, but ${found.path} is ${version}: ${how}`);
  }
  return found.path;
}

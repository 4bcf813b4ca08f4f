// A private `nats-server -js` child process: for `npm start` without NATS_URL and for tests.
// Data lives in `storeDir`, so a restart on the same directory keeps every bucket.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { accessSync, constants } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { natsServerPath } from "./nats-binary.ts";
import { parseNatsSync, syncIntervalConfig } from "./nats-sync.ts";

export interface NatsServerOptions {
  storeDir: string;
  /** Client port; 0 picks a free one. */
  port?: number;
  /** Largest message in bytes; raised above NATS' 1 MiB default so 1 MiB bodies fit. */
  maxPayload?: number;
  /** Extra lines for the config file (e.g. cluster routes). */
  extraConfig?: string;
  /** The `authorization {}` block (`authorizationConfig`); none: anonymous access. */
  authorization?: string;
  /** Server name; required to be unique in a cluster. */
  serverName?: string;
  /** Default: `natsServerPath()` (NATS_SERVER_BIN, `.tools/`, PATH, /usr/sbin; >= 2.12). */
  binary?: string;
  /** JetStream's `sync_interval`: a Go duration or `always`. Default: `NATS_SYNC`, else `1s`. */
  sync?: string;
  /**
   * Ready only once the route listener is up too (a cluster node): the server reports ready
   * before it binds its route port, and exits if that port is taken.
   */
  awaitRoutes?: boolean;
  /**
   * Tie the server to this process (`npm start`'s private server): it runs in a session of its
   * own, so a terminal's SIGHUP (which nats-server takes as "reload") or Ctrl-C reaches only
   * the service, which stops it after closing its connections; and where util-linux `setpriv`
   * exists, the kernel sends it SIGTERM when this process dies, even by SIGKILL.
   */
  dieWithParent?: boolean;
  /**
   * Called with each `[WRN]` and `[ERR]` line the server prints after start-up (its pid and time
   * stripped): a write error for lack of space, a refused login, a lost route. Everything else
   * it prints is drained unread.
   */
  onLog?: (level: "warn" | "error", line: string) => void;
}

export interface NatsServer {
  readonly url: string;
  readonly port: number;
  readonly pid: number;
  readonly process: ChildProcess;
  /** SIGTERM, then SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

/** A free TCP port on 127.0.0.1 (the usual listen-on-0-then-close; races are rare). */
export async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, "127.0.0.1");
  await once(srv, "listening");
  const port = (srv.address() as { port: number }).port;
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

export async function startNatsServer(options: NatsServerOptions): Promise<NatsServer> {
  if (options.port) return startOn(options, options.port);
  // A port found free can be taken by another process before the server binds it: then another.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOn(options, await freePort());
    } catch (err) {
      if (attempt === 3 || !(err as Error).message.includes("address already in use")) throw err;
    }
  }
}

async function startOn(options: NatsServerOptions, port: number): Promise<NatsServer> {
  const binary = options.binary ?? natsServerPath();
  const sync = parseNatsSync(options.sync ?? process.env.NATS_SYNC);
  await mkdir(options.storeDir, { recursive: true });
  const configPath = join(options.storeDir, "nats-server.conf");
  const config = [
    `listen: "127.0.0.1:${port}"`,
    `server_name: ${JSON.stringify(options.serverName ?? `local-${port}`)}`,
    `max_payload: ${options.maxPayload ?? 8 * 1024 * 1024}`,
    `jetstream { store_dir: ${JSON.stringify(join(options.storeDir, "jetstream"))}, ${syncIntervalConfig(sync)} }`,
    options.extraConfig ?? "",
    options.authorization ?? "",
  ].join("\n");
  // 0600: the config may name credentials.
  await writeFile(configPath, config, { mode: 0o600 });
  const setpriv = options.dieWithParent ? findSetpriv() : undefined;
  const command = setpriv ? [setpriv, "--pdeathsig", "SIGTERM", "--", binary] : [binary];
  const child = spawn(command[0]!, [...command.slice(1), "-c", configPath], {
    stdio: ["ignore", "ignore", "pipe"],
    detached: options.dieWithParent === true,
  });
  await waitUntilReady(child, options.awaitRoutes ? [READY, ROUTES_READY] : [READY]);
  if (options.onLog) forwardLogLines(child, options.onLog);
  const stop = async (graceMs = 5_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, "exit");
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  };
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    pid: child.pid!,
    process: child,
    stop,
  };
}

/** util-linux `setpriv` (it sets the parent-death signal, then execs: the pid stays the server's). */
function findSetpriv(): string | undefined {
  return ["/usr/bin/setpriv", "/bin/setpriv"].find((path) => {
    try {
      accessSync(path, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** `[pid] date time [LVL] text` → the level and the text of a warning or an error line. */
export function serverLogLine(line: string): { level: "warn" | "error"; text: string } | undefined {
  const match = /\[(WRN|ERR|FTL)\]\s+(.*)$/.exec(line);
  if (!match) return undefined;
  return { level: match[1] === "WRN" ? "warn" : "error", text: match[2]!.trim() };
}

function forwardLogLines(child: ChildProcess, onLog: NonNullable<NatsServerOptions["onLog"]>): void {
  let partial = "";
  child.stderr!.on("data", (chunk: Buffer) => {
    const lines = (partial + chunk.toString()).split("\n");
    // A line split across chunks waits for its end; one that never ends is cut at 8 KiB.
    partial = lines.pop()!.slice(-8_192);
    for (const line of lines) {
      const found = serverLogLine(line);
      if (found) onLog(found.level, found.text);
    }
  });
}

const READY = "Server is ready";
const ROUTES_READY = "Listening for route connections";

/** Resolves with the server's log up to the moment every one of `lines` has appeared in it. */
function waitUntilReady(child: ChildProcess, lines: readonly string[], timeoutMs = 15_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let log = ""; // a few KB: the start-up lines only
    const timer = setTimeout(() => fail(new Error(`nats-server not ready after ${timeoutMs} ms`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      log += chunk.toString();
      if (lines.every((line) => log.includes(line))) {
        cleanup();
        child.stderr!.resume(); // keep draining so the pipe never blocks the server
        resolve(log);
      }
    };
    const onExit = (code: number | null) =>
      fail(new Error(`nats-server exited (${code}) before it was ready:\n${log.slice(-4000).trim()}`));
    const onError = (err: Error) => fail(err);
    function cleanup() {
      clearTimeout(timer);
      child.stderr!.off("data", onData);
      child.off("exit", onExit);
      child.off("error", onError);
    }
    function fail(err: Error) {
      cleanup();
      child.kill("SIGKILL");
      reject(err);
    }
    child.stderr!.on("data", onData);
    child.once("exit", onExit);
    child.once("error", onError);
  });
}

/**
 * Stops a server left behind by an earlier run on the same store (its pid in `pidFile`).
 * Only a nats-server running this store's config is touched. Call it only when no live service
 * owns the store (`acquireInstanceLock`): a running service's server looks exactly the same.
 */
export async function stopStaleServer(pidFile: string, storeDir: string): Promise<void> {
  const old = Number((await readFile(pidFile, "utf8").catch(() => "")).trim());
  if (!Number.isInteger(old) || old <= 0) return;
  const cmdline = await readFile(`/proc/${old}/cmdline`, "utf8").catch(() => "");
  if (!cmdline.includes("nats-server") || !cmdline.includes(join(storeDir, "nats-server.conf"))) return;
  process.kill(old, "SIGTERM");
  for (let i = 0; i < 50 && (await readFile(`/proc/${old}/cmdline`, "utf8").catch(() => "")); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
}

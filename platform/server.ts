// A private `nats-server -js` child process: for `npm start` without NATS_URL and for tests.
// Data lives in `storeDir`, so a restart on the same directory keeps every bucket.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";

export interface NatsServerOptions {
  storeDir: string;
  /** Client port; 0 picks a free one. */
  port?: number;
  /** Largest message in bytes; raised above NATS' 1 MiB default so 1 MiB bodies fit. */
  maxPayload?: number;
  /** Extra lines for the config file (e.g. cluster routes). */
  extraConfig?: string;
  /** Server name; required to be unique in a cluster. */
  serverName?: string;
  binary?: string;
  /**
   * Ready only once the route listener is up too (a cluster node): the server reports ready
   * before it binds its route port, and exits if that port is taken.
   */
  awaitRoutes?: boolean;
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
  const port = options.port || (await freePort());
  await mkdir(options.storeDir, { recursive: true });
  const configPath = join(options.storeDir, "nats-server.conf");
  const config = [
    `listen: "127.0.0.1:${port}"`,
    `server_name: ${JSON.stringify(options.serverName ?? `local-${port}`)}`,
    `max_payload: ${options.maxPayload ?? 8 * 1024 * 1024}`,
    `jetstream { store_dir: ${JSON.stringify(join(options.storeDir, "jetstream"))} }`,
    options.extraConfig ?? "",
  ].join("\n");
  await writeFile(configPath, config);
  const child = spawn(options.binary ?? "nats-server", ["-c", configPath], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  await waitUntilReady(child, options.awaitRoutes ? [READY, ROUTES_READY] : [READY]);
  const stop = async (graceMs = 5_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, "exit");
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  };
  return { url: `nats://127.0.0.1:${port}`, port, pid: child.pid!, process: child, stop };
}

const READY = "Server is ready";
const ROUTES_READY = "Listening for route connections";

function waitUntilReady(child: ChildProcess, lines: readonly string[], timeoutMs = 15_000): Promise<void> {
  return new Promise((resolve, reject) => {
    let log = "";
    const timer = setTimeout(() => fail(new Error(`nats-server not ready after ${timeoutMs} ms`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      log = (log + chunk.toString()).slice(-4000);
      if (lines.every((line) => log.includes(line))) {
        cleanup();
        child.stderr!.resume(); // keep draining so the pipe never blocks the server
        resolve();
      }
    };
    const onExit = (code: number | null) =>
      fail(new Error(`nats-server exited (${code}) before it was ready:\n${log.trim()}`));
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
 * Only a process whose command line is nats-server is touched.
 */
export async function stopStaleServer(pidFile: string): Promise<void> {
  const old = Number((await readFile(pidFile, "utf8").catch(() => "")).trim());
  if (!Number.isInteger(old) || old <= 0) return;
  const cmdline = await readFile(`/proc/${old}/cmdline`, "utf8").catch(() => "");
  if (!cmdline.includes("nats-server")) return;
  process.kill(old, "SIGTERM");
  for (let i = 0; i < 50 && (await readFile(`/proc/${old}/cmdline`, "utf8").catch(() => "")); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
}

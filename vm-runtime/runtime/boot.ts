// Runs the runtime inside an instance process: reads its secret from the host's stdin pipe
// (never the environment, which /proc/self/environ would show to image code), listens on a
// TCP port (announced by the ready line) or on a unix socket the provider named, and exits
// on SIGTERM or when the host's stdin pipe closes (host gone).
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import type { Image } from "../image.ts";
import { createRuntimeServer, type RuntimeOptions } from "./server.ts";
import { CHECKPOINT_SIGNAL } from "../wire/rpc.ts";
import { collectWhenIdle } from "./idle-gc.ts";

/** Key of the one JSON line on stdout announcing the listening port. */
export const READY_KEY = "~microvm/runtime";

/** The ready line: `{"~microvm/runtime":"ready","port":N}`. */
export interface ReadyLine {
  readonly [READY_KEY]: "ready";
  readonly port: number;
}

export interface BootOptions extends RuntimeOptions {
  readonly port?: number;
  readonly host?: string;
  /** Listen on this unix socket instead of a TCP port (no ready line: the provider probes it). */
  readonly socketPath?: string;
  /** Exit when stdin ends: the host holds it open, so EOF means the host died. */
  readonly exitWhenStdinEnds?: boolean;
  /** Quiet time before the heap is compacted and its free pages returned (default IDLE_GC_AFTER_MS). */
  readonly idleGcAfterMs?: number;
}

/**
 * The runtime's first stdout line, `{"~microvm/runtime":"booted"}`: node took its flags and
 * loaded the runtime, and no image code has run yet. A wall that ends before printing it
 * failed for a reason of the host (a flag node refuses, a binary missing), never the image's.
 */
export const BOOTED_LINE = JSON.stringify({ [READY_KEY]: "booted" });

/**
 * A launch snapshot's template printed it once its image is imported (no identity yet): the
 * host saves the sandbox then.
 */
export const LOADED_LINE = JSON.stringify({ [READY_KEY]: "loaded" });

/** Parses a stdout line; the port when it is the ready line. */
export function parseReadyLine(line: string): number | undefined {
  try {
    const parsed = JSON.parse(line) as Partial<ReadyLine>;
    return parsed[READY_KEY] === "ready" && Number.isInteger(parsed.port) ? parsed.port : undefined;
  } catch {
    return undefined;
  }
}

export async function bootRuntime(image: Image, options: BootOptions = {}): Promise<Server> {
  const server = createRuntimeServer(image, options);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    const listening = () => {
      server.off("error", reject);
      resolve();
    };
    if (options.socketPath !== undefined) server.listen(options.socketPath, listening);
    else server.listen(options.port ?? 0, options.host ?? "127.0.0.1", listening);
  });
  if (options.socketPath === undefined) {
    const { port } = server.address() as AddressInfo;
    const ready: ReadyLine = { [READY_KEY]: "ready", port };
    process.stdout.write(`${JSON.stringify(ready)}\n`);
  }
  installShutdown(server, options.exitWhenStdinEnds ?? false);
  collectWhenIdle(server, options.idleGcAfterMs);
  if (options.socketPath !== undefined) installCheckpointToggle(server, options.socketPath);
  return server;
}

/**
 * Lines the host writes on the runtime's stdin around a checkpoint (runtime of this version):
 * `close` before it (the listener and every connection close, the socket file goes), `listen`
 * on the restored wall's stdin, read as soon as the restored runtime runs (nothing polls the
 * wall's state, no command runs to signal it). A runtime restored from an earlier checkpoint
 * knows only CHECKPOINT_SIGNAL, each of which does the other of the two.
 */
export const CONTROL_LINES = {
  close: JSON.stringify({ [READY_KEY]: "close" }),
  listen: JSON.stringify({ [READY_KEY]: "listen" }),
} as const;
/**
 * Printed once the listener closed for a checkpoint: its socket is closed then, not only its file
 * gone (node unlinks the file before it closes the socket, and a checkpoint between the two
 * fails: a wall cannot save a bound host socket).
 */
export const CLOSED_LINE = JSON.stringify({ [READY_KEY]: "closed" });
/** Longest control line read from stdin once the runtime serves; longer ones are dropped. */
const CONTROL_LINE_LIMIT = 256;

/** Closes the listener and listens again, as the host's control lines or signals say. */
function installCheckpointToggle(server: Server, socketPath: string): void {
  let listening = true;
  const listen = () => {
    listening = true;
    server.listen(socketPath);
  };
  const close = () => {
    listening = false;
    server.close(() => process.stdout.write(`${CLOSED_LINE}\n`));
    server.closeAllConnections();
  };
  process.on(CHECKPOINT_SIGNAL, () => (listening ? close() : listen()));
  let pending = "";
  process.stdin.on("data", (chunk: Buffer | string) => {
    pending += chunk.toString();
    for (let newline = pending.indexOf("\n"); newline !== -1; newline = pending.indexOf("\n")) {
      const line = pending.slice(0, newline).trim();
      pending = pending.slice(newline + 1);
      if (line === CONTROL_LINES.listen && !listening) listen();
      if (line === CONTROL_LINES.close && listening) close();
    }
    if (pending.length > CONTROL_LINE_LIMIT) pending = "";
  });
}

/** Longest secret line accepted on stdin. */
const SECRET_LINE_LIMIT = 1024;

/**
 * Reads the first line of stdin (the host writes the access secret there before anything of
 * the image runs); resolves with "" when stdin ends first. Leaves stdin open for the EOF watch.
 */
export function readSecretLine(stdin: NodeJS.ReadableStream = process.stdin): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    const onData = (chunk: Buffer | string) => {
      text += chunk.toString();
      const newline = text.indexOf("\n");
      if (newline !== -1) finish(text.slice(0, newline));
      else if (text.length > SECRET_LINE_LIMIT) fail(new Error("secret line too long"));
    };
    const onEnd = () => finish(text);
    const cleanup = () => {
      stdin.off("data", onData);
      stdin.off("end", onEnd);
      stdin.off("error", fail);
      stdin.pause();
    };
    function finish(line: string) {
      cleanup();
      resolve(line.trim());
    }
    function fail(error: Error) {
      cleanup();
      reject(error);
    }
    stdin.on("data", onData);
    stdin.once("end", onEnd);
    stdin.once("error", fail);
  });
}

function installShutdown(server: Server, exitWhenStdinEnds: boolean): void {
  const shutdown = () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 500).unref();
  };
  process.once("SIGTERM", shutdown);
  process.once("SIGINT", shutdown);
  // An image's forgotten promise must not take the whole instance down.
  process.on("unhandledRejection", (reason) => {
    const detail = reason instanceof Error ? `${reason.name}: ${reason.message}` : String(reason);
    process.stderr.write(`[microvm-runtime] unhandled rejection: ${detail}\n`);
  });
  if (exitWhenStdinEnds) {
    process.stdin.on("end", shutdown).on("close", shutdown).on("error", shutdown);
    process.stdin.resume();
  }
}

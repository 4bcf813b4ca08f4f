// Runs the runtime inside an instance process: listens, prints the ready line the host
// waits for, and exits on SIGTERM or when the host's stdin pipe closes (host gone).
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import type { Image } from "./image.ts";
import { createRuntimeServer, type RuntimeOptions } from "./runtime.ts";

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
  /** Exit when stdin ends: the host holds it open, so EOF means the host died. */
  readonly exitWhenStdinEnds?: boolean;
}

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
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const ready: ReadyLine = { [READY_KEY]: "ready", port };
  process.stdout.write(JSON.stringify(ready) + "\n");
  installShutdown(server, options.exitWhenStdinEnds ?? false);
  return server;
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

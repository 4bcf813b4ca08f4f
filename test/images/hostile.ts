// Test-only hostile image: each method tries one escape from its instance (network, signals,
// files, output flood, CPU, memory, disk, outliving its host) and reports what happened.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer, connect } from "node:net";
import { join } from "node:path";
import { defineImage } from "../../vm-runtime/image.ts";

const code = (error: unknown) => (error as { code?: string }).code ?? (error as Error).message;
const retained: Buffer[] = [];

export default defineImage({
  methods: {
    ping: { handler: () => "pong" },
    whoami: {
      handler: () => ({
        pid: process.pid,
        ppid: process.ppid,
        uid: process.getuid?.(),
        env: Object.keys(process.env).sort(),
      }),
    },
    /** "connected", or the error code of a TCP connect to host:port. */
    connect: {
      handler: (host: string, port: number) =>
        new Promise<string>((resolve) => {
          const socket = connect({ host, port, timeout: 2_000 });
          socket.once("connect", () => {
            socket.destroy();
            resolve("connected");
          });
          socket.once("timeout", () => {
            socket.destroy();
            resolve("ETIMEDOUT");
          });
          socket.once("error", (error) => resolve(code(error)));
        }),
    },
    /** Sends `signal` to `pid`: "sent" or the error code. */
    kill: {
      handler: (pid: number, signal: string) => {
        try {
          process.kill(pid, signal);
          return "sent";
        } catch (error) {
          return code(error);
        }
      },
    },
    /** "allowed" (with the size) or the error code. */
    readFile: {
      handler: (path: string) => {
        try {
          return `allowed:${readFileSync(path).length}`;
        } catch (error) {
          return code(error);
        }
      },
    },
    listDir: {
      handler: (path: string) => {
        try {
          return readdirSync(path);
        } catch (error) {
          return code(error);
        }
      },
    },
    /** Starts writing `mib` MiB to stdout in one line (no newline); returns at once. */
    flood: {
      handler: (mib: number) => {
        const chunk = Buffer.alloc(1024 * 1024, "x");
        let left = mib;
        const more = () => {
          while (left > 0) {
            left -= 1;
            if (!process.stdout.write(chunk)) return void process.stdout.once("drain", more);
          }
        };
        more();
        return "flooding";
      },
    },
    /** Burns CPU in 50 ms slices for `ms` (still answering between slices); returns at once. */
    spin: {
      handler: (ms: number) => {
        const until = Date.now() + ms;
        const burn = () => {
          const end = Date.now() + 50;
          while (Date.now() < end);
          if (Date.now() < until) setImmediate(burn);
        };
        setImmediate(burn);
        return "spinning";
      },
    },
    /** Allocates off-heap memory without bound (never returns while the instance lives). */
    allocate: {
      handler: (): number => {
        for (;;) retained.push(Buffer.alloc(16 * 1024 * 1024, 1));
      },
    },
    /** Writes 1 MiB files into $HOME until `mib` MiB or an error: the bytes written and the error code. */
    fillScratch: {
      handler: (mib: number) => {
        const chunk = Buffer.alloc(1024 * 1024, 1);
        let written = 0;
        try {
          for (let i = 0; i < mib; i++) {
            writeFileSync(join(process.env.HOME ?? "/tmp", `fill-${i}`), chunk);
            written += 1;
          }
          return { written, code: "none" };
        } catch (error) {
          return { written, code: code(error) };
        }
      },
    },
    /** Replaces process.exit and the signal handlers, so only a kill from outside ends it. */
    hijackExit: {
      handler: () => {
        process.exit = (() => undefined) as never;
        for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const) {
          process.removeAllListeners(signal);
          process.on(signal, () => undefined);
        }
        process.stdin.removeAllListeners();
        return "hijacked";
      },
    },
    /** Binds TCP `port` on all addresses inside the instance: "listening" or the error code. */
    listen: {
      handler: (port: number) =>
        new Promise<string>((resolve) => {
          const server = createServer();
          server.once("error", (error) => resolve(code(error)));
          server.listen(port, "0.0.0.0", () => resolve("listening"));
        }),
    },
    /** Serves HTTP on `port` inside the instance, answering `port <n> <path>`. */
    serve: {
      handler: (port: number) =>
        new Promise<string>((resolve) => {
          const server = createHttpServer((req, res) => res.end(`port ${port} ${req.url}`));
          server.once("error", (error) => resolve(code(error)));
          server.listen(port, "127.0.0.1", () => resolve("serving"));
        }),
    },
    /** Starts a child process: "spawned" or the error code. */
    spawn: {
      handler: () =>
        new Promise<string>((resolve) => {
          try {
            const child = spawn("/bin/sh", ["-c", "true"]);
            child.once("error", (error) => resolve(code(error)));
            child.once("spawn", () => resolve("spawned"));
          } catch (error) {
            resolve(code(error));
          }
        }),
    },
    /**
     * Replaces the runtime's socket at /run/microvm/runtime.sock: by a symlink to `target`
     * ("link"), or by a socket of its own answering "squatted" ("socket"): "planted" or the error code.
     */
    plantSocket: {
      handler: (kind: "link" | "socket", target: string) =>
        new Promise<string>((resolve) => {
          const path = "/run/microvm/runtime.sock";
          try {
            unlinkSync(path);
            if (kind === "link") {
              symlinkSync(target, path);
              return resolve("planted");
            }
            const server = createHttpServer((_req, res) => res.end('"squatted"'));
            server.once("error", (error) => resolve(code(error)));
            server.listen(path, () => resolve("planted"));
          } catch (error) {
            resolve(code(error));
          }
        }),
    },
  },
});

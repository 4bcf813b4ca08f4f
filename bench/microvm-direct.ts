// Instance runtimes started by hand, outside the host: the sandbox bundle on plain node with
// the process provider's command line (sh + ulimit -d, permission model, heap cap) plus any
// extra node flags, and a secret of our own. They give the baseline the host's instances
// cannot (their secret stays in the host) and the node-flag experiment.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { once } from "node:events";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { builtinImages, bundleImage } from "../vm-runtime/service/index.ts";
import { dataLimitMiB } from "../vm-runtime/host/process-provider.ts";
import { INSTANCE_SECRET_HEADER } from "../vm-runtime/wire/rpc.ts";
import { parseReadyLine } from "../vm-runtime/runtime/boot.ts";
import { permissionFlag, permissionGrants } from "../vm-runtime/host/node-args.ts";
import { tempDir } from "./children.ts";

/** In the work directory's name, so leftover checks find these processes. */
export const DIRECT_MARKER = "bench-microvm-direct";

/** What `vm-runtime/host/process-provider.ts` (spawnInstance) runs; keep the two in step. */
const LIMIT_SCRIPT = 'ulimit -d "$1" || exit 97; shift; exec "$@"';

export interface DirectRuntime {
  readonly pid: number;
  readonly port: number;
  /** `x-instance-secret`: the header the proxy would add. */
  readonly headers: Readonly<Record<string, string>>;
  /** Spawn → ready line on stdout, in ms. */
  readonly readyMs: number;
  stop(): Promise<void>;
}

export interface DirectOptions {
  /** Extra node flags, before the provider's own (`--max-old-space-size` is replaced if given). */
  readonly nodeFlags?: readonly string[];
  readonly memoryMiB?: number;
  readonly permissions?: boolean;
  /** `floor`: a bare node:http server instead of the sandbox bundle (what any node process costs). */
  readonly entry?: "sandbox" | "floor";
}

/** The floor: answers 200 to anything after reading the body; the runtime's ready line and exit on stdin EOF. */
const FLOOR_SOURCE = `import { createServer } from "node:http";
const body = JSON.stringify("hello, x!");
const server = createServer((req, res) => {
  req.on("data", () => {});
  req.on("end", () => res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body));
});
server.keepAliveTimeout = 65_000;
server.listen(Number(process.env.MICROVM_RUNTIME_PORT ?? 0), "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ "~microvm/runtime": "ready", port: server.address().port }) + "\\n");
});
process.stdin.on("end", () => process.exit(0)).resume();
`;

const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of running) child.kill("SIGKILL");
});

/** A directory with the sandbox bundle; `close()` stops every runtime and removes it. */
export async function directRuntimes() {
  const work = await tempDir(`${DIRECT_MARKER}-`);
  const workDir = work.path;
  const bundle = await bundleImage(builtinImages.sandbox, join(workDir, "images"));
  const floor = join(workDir, "images", "floor.mjs");
  await writeFile(floor, FLOOR_SOURCE);
  const started = new Set<DirectRuntime>();
  return {
    workDir,
    bundle,
    async start(options: DirectOptions = {}): Promise<DirectRuntime> {
      const runtime = await startRuntime(options.entry === "floor" ? floor : bundle, workDir, options);
      started.add(runtime);
      return runtime;
    },
    async close() {
      await Promise.all([...started].map((r) => r.stop()));
      await work.remove();
    },
  };
}

async function startRuntime(bundle: string, workDir: string, options: DirectOptions): Promise<DirectRuntime> {
  const scratch = join(workDir, "instances", randomBytes(4).toString("hex"));
  await mkdir(scratch, { recursive: true, mode: 0o700 });
  const secret = randomBytes(24).toString("base64url");
  const extra = options.nodeFlags ?? [];
  const memoryMiB = options.memoryMiB ?? 256;
  const heapCap = extra.some((f) => f.startsWith("--max-old-space-size")) ? [] : [`--max-old-space-size=${memoryMiB}`];
  const nodeArgs = [
    "--no-warnings",
    ...heapCap,
    ...extra,
    ...((options.permissions ?? true)
      ? [
          permissionFlag(),
          ...permissionGrants(),
          `--allow-fs-read=${bundle}`,
          `--allow-fs-read=${scratch}`,
          `--allow-fs-write=${scratch}`,
        ]
      : []),
    bundle,
  ];
  const startedAt = performance.now();
  const child = spawn(
    "/bin/sh",
    ["-c", LIMIT_SCRIPT, DIRECT_MARKER, String(dataLimitMiB(memoryMiB) * 1024), process.execPath, ...nodeArgs],
    {
      detached: true,
      cwd: scratch,
      stdio: ["pipe", "pipe", "pipe"],
      env: {
        PATH: "/usr/local/bin:/usr/bin:/bin",
        HOME: scratch,
        TMPDIR: scratch,
        LANG: "C.UTF-8",
        NODE_ENV: "production",
        MICROVM_ID: "bench-direct",
        MICROVM_RUNTIME_PORT: "0",
      },
    },
  );
  running.add(child);
  // As the providers do: the entry reads its secret from stdin before the image is evaluated.
  child.stdin!.write(`${secret}\n`);
  child.stdin!.on("error", () => undefined);
  child.on("error", () => undefined);
  const exited = once(child, "exit").then(() => running.delete(child));
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2048)));
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`runtime not ready after 15 s: ${stderr}`)), 15_000);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const announced = parseReadyLine(line);
      if (announced !== undefined) {
        clearTimeout(timer);
        resolve(announced);
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`runtime (${extra.join(" ")}) exited ${signal ?? code}: ${stderr.trim()}`));
    });
  }).catch(async (err: unknown) => {
    // Not handed out, so no `stop()` would ever end it.
    if (child.exitCode === null && child.signalCode === null) process.kill(-child.pid!, "SIGKILL");
    await exited;
    throw err;
  });
  const readyMs = performance.now() - startedAt;
  return {
    pid: child.pid!,
    port,
    headers: { [INSTANCE_SECRET_HEADER]: secret },
    readyMs,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        try {
          process.kill(-child.pid!, "SIGKILL");
        } catch {
          // already gone
        }
      }
      await exited;
      await rm(scratch, { recursive: true, force: true });
    },
  };
}

// Runs `main.ts` as a real child process (cluster/process.ts starts it and waits for "ready").
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { startNodeProcess } from "../../cluster/process.ts";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../..", import.meta.url));

export interface ServiceProcess {
  child: ChildProcess;
  taskUrl: string;
  jobUrl: string;
  /** The microVM API (role gateway). */
  microvmUrl: string;
  /** Lines the process logged, parsed. */
  logs: Record<string, unknown>[];
  /** SIGTERM (or `signal`) and wait for the exit; resolves to the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

export interface ServiceProcessOptions {
  /** Its own process group (as a terminal session's job): signal the group with `process.kill(-pid, …)`. */
  detached?: boolean;
  /** Working directory (default: the repository), where a relative DATA_DIR lives. */
  cwd?: string;
  /** The node arguments that run the service (default: main.ts through tsx; `npm start` runs `dist/main.mjs`). */
  entry?: string[];
}

export async function startServiceProcess(
  env: Record<string, string>,
  args: string[] = [],
  options: ServiceProcessOptions = {},
): Promise<ServiceProcess> {
  // Without a DATA_DIR of its own, a process with the microvms role would keep its token key and
  // instance bundles in the repository's `.data`, shared by every test process.
  const ownDataDir = env.DATA_DIR || options.cwd ? undefined : mkdtempSync(join(tmpdir(), "svc-proc-"));
  const removeDataDir = () => ownDataDir && rmSync(ownDataDir, { recursive: true, force: true });
  const logs: Record<string, unknown>[] = [];
  const started = await startNodeProcess({
    name: "service",
    args: [...(options.entry ?? ["--import", "tsx", "main.ts"]), ...args],
    cwd: options.cwd ?? root,
    env: {
      ...process.env,
      TASK_API_PORT: "0",
      JOB_API_PORT: "0",
      MICROVM_API_PORT: "0",
      LOG_LEVEL: "info",
      ...(ownDataDir ? { DATA_DIR: ownDataDir } : {}),
      ...env,
    },
    detached: options.detached === true,
    readyTimeoutMs: 30_000,
    onLine: (_, line) => {
      if (!line.startsWith("{")) return;
      try {
        logs.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        /* not a log line */
      }
    },
  }).catch((err: unknown) => {
    removeDataDir();
    throw err;
  });
  const { child } = started;
  const exit = once(child, "exit");
  if (ownDataDir) void exit.then(removeDataDir);
  const listening = started.startup.find((entry) => entry.msg === "gateway listening") ?? {};
  return {
    child,
    logs,
    taskUrl: `http://127.0.0.1:${listening.taskPort}`,
    jobUrl: `http://127.0.0.1:${listening.jobPort}`,
    microvmUrl: `http://127.0.0.1:${listening.microvmPort}`,
    async stop(signal = "SIGTERM") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const [code] = await exit;
      return code as number | null;
    },
  };
}

export interface Exited {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `file args` (e.g. main.ts through tsx) in the checkout to its exit, on `node`; fails after `timeoutMs`. */
export function runToExit(
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 60_000,
  node = process.execPath,
): Promise<Exited> {
  const child = spawn(node, ["--import", "tsx", ...args], {
    cwd: root,
    env: { ...process.env, TASK_API_PORT: "0", JOB_API_PORT: "0", MICROVM_API_PORT: "0", LOG_LEVEL: "info", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (d) => (stdout += d));
  child.stderr!.on("data", (d) => (stderr += d));
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  return new Promise((resolve) =>
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    }),
  );
}

/** True while a process with `pid` runs (a zombie waiting for its reaper counts as gone). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** A data directory for `npm start`'s process, removed after the test with any nats-server still running on it. */
export async function serviceDataDir(t: { after(fn: () => unknown): void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "svc-data-"));
  t.after(async () => {
    const pid = Number(await readFile(join(dir, "nats-server.pid"), "utf8").catch(() => "0"));
    if (pid > 0 && alive(pid)) process.kill(pid, "SIGKILL");
    await rm(dir, { recursive: true, force: true });
  });
  return dir;
}

/**
 * The first log entry `match` accepts, once the service has logged it (its pipe may lag its answers; fails after
 * `timeoutMs`).
 */
export async function loggedWithin(
  svc: { readonly logs: readonly Record<string, unknown>[] },
  timeoutMs: number,
  match: (entry: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = svc.logs.find(match);
    if (found) return found;
    assert.ok(Date.now() < deadline, `not logged within ${timeoutMs} ms: ${JSON.stringify(svc.logs.slice(-5))}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// Service processes of a topology: `main.ts --role <role>` as child processes, ready when they
// log "ready", stopped by pid; plus the clean-up of processes an earlier run left behind.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export type Role = "gateway" | "actors" | "microvms";

const root = fileURLToPath(new URL("..", import.meta.url));

/** Env var naming the run directory in every process a run starts, to find them again. */
export const RUN_MARKER = "TYPED_SERVICE_CLUSTER_DIR";

export interface RoleProcessOptions {
  readonly name: string;
  readonly role: Role;
  /** Comma-separated URLs of every NATS node. */
  readonly natsUrl: string;
  readonly dataDir: string;
  /** The run directory, recorded in the process environment (see `stopLeftovers`). */
  readonly runDir: string;
  readonly env?: Readonly<Record<string, string>>;
  /** Every output line: JSON logs on stdout, anything on stderr. */
  readonly onLine?: (name: string, line: string) => void;
  readonly readyTimeoutMs?: number;
  /** Called with the pid right after the spawn. */
  readonly onSpawn?: (pid: number) => void;
}

export interface GatewayPorts {
  readonly task: number;
  readonly job: number;
  readonly microvm: number;
}

export interface RoleProcess {
  readonly name: string;
  readonly role: Role;
  readonly pid: number;
  readonly child: ChildProcess;
  /** Where a gateway listens (role gateway only). */
  readonly ports?: GatewayPorts;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Starts `main.ts --role <role>` in its own process group (a Ctrl-C in the terminal reaches the
 * runner only, which stops the roles in order) and waits for its "ready" log line.
 */
export async function startRole(options: RoleProcessOptions): Promise<RoleProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", "main.ts", "--role", options.role], {
    cwd: root,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
    env: {
      ...process.env,
      LOG_LEVEL: "info", // readiness is read from the info lines
      ...options.env,
      NATS_URL: options.natsUrl,
      DATA_DIR: options.dataDir,
      [RUN_MARKER]: options.runDir,
    },
  });
  const exited = once(child, "exit");
  if (child.pid) options.onSpawn?.(child.pid);
  const tail: string[] = [];
  const onLine = (line: string) => {
    tail.push(line);
    if (tail.length > 20) tail.shift();
    options.onLine?.(options.name, line);
  };
  createInterface({ input: child.stderr! }).on("line", onLine);
  const listening = await new Promise<Record<string, unknown>>((resolve, reject) => {
    let gateway: Record<string, unknown> = {};
    const timeoutMs = options.readyTimeoutMs ?? 60_000;
    const timer = setTimeout(() => reject(new Error(`${options.name} not ready after ${timeoutMs} ms:\n${tail.join("\n")}`)), timeoutMs);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      onLine(line);
      const entry = parseLog(line);
      if (entry?.msg === "gateway listening") gateway = entry;
      if (entry?.msg === "ready") {
        clearTimeout(timer);
        resolve(gateway);
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${options.name} exited (${code ?? signal}) before it was ready:\n${tail.join("\n")}`));
    });
  }).catch(async (err: unknown) => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
    throw err;
  });
  const stop = async (graceMs = 10_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  };
  const ports =
    options.role === "gateway"
      ? { task: Number(listening.taskPort), job: Number(listening.jobPort), microvm: Number(listening.microvmPort) }
      : undefined;
  return { name: options.name, role: options.role, pid: child.pid!, child, ports, stop };
}

function parseLog(line: string): Record<string, unknown> | undefined {
  if (!line.startsWith("{")) return undefined;
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

const pidsFile = (runDir: string) => join(runDir, "pids.json");

/** Records the pids a run started, so the next run can stop them if this one was killed. */
export async function recordPids(runDir: string, pids: readonly number[]): Promise<void> {
  await writeFile(pidsFile(runDir), JSON.stringify(pids));
}

/**
 * Stops the processes an earlier run in `runDir` left (its runner was SIGKILLed). Only a pid
 * whose environment carries this run directory, or whose command line names it, is touched.
 */
export async function stopLeftovers(runDir: string): Promise<number[]> {
  const recorded = JSON.parse(await readFile(pidsFile(runDir), "utf8").catch(() => "[]")) as number[];
  const ours = [];
  for (const pid of recorded) if (await belongsTo(pid, runDir)) ours.push(pid);
  for (const pid of ours) signal(pid, "SIGTERM");
  for (let i = 0; i < 50 && ours.some(running); i++) await new Promise((r) => setTimeout(r, 100));
  for (const pid of ours.filter(running)) signal(pid, "SIGKILL");
  return ours;
}

async function belongsTo(pid: number, runDir: string): Promise<boolean> {
  const environ = await readFile(`/proc/${pid}/environ`, "utf8").catch(() => "");
  const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
  return environ.split("\0").includes(`${RUN_MARKER}=${runDir}`) || cmdline.includes(join(runDir, "/"));
}

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    /* already gone */
  }
}

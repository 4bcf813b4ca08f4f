// Service processes of a topology: `main.ts --role <role>` as child processes, ready when they
// log "ready", stopped by pid; plus the clean-up of processes an earlier run left behind.
import { readFileSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { startNodeProcess, type NodeProcess, type NodeProcessOptions } from "./process.ts";

export type Role = "gateway" | "actors" | "microvms";

/** What one process runs: a role, several (`--role gateway,actors`), or `all` (main.ts's default). */
export type RoleSet = Role | "all" | readonly Role[];

const root = fileURLToPath(new URL("..", import.meta.url));

/** Env var naming the run directory in every process a run starts, to find them again. */
export const RUN_MARKER = "TYPED_SERVICE_CLUSTER_DIR";

/** `node` arguments that run the service from source (tsx), as `npm run dev` does. */
const FROM_SOURCE = ["--import", "tsx", "main.ts"];

/** `name`, `onLine`, `readyTimeoutMs` and `onSpawn` as for any node process (process.ts). */
export interface RoleProcessOptions extends Pick<NodeProcessOptions, "name" | "onLine" | "readyTimeoutMs" | "onSpawn"> {
  readonly role: RoleSet;
  /** Comma-separated URLs of every NATS node. */
  readonly natsUrl: string;
  readonly dataDir: string;
  /** The run directory, recorded in the process environment (see `stopLeftovers`). */
  readonly runDir: string;
  readonly env?: Readonly<Record<string, string>>;
  /** The environment `env` is laid over (default: this process's). */
  readonly baseEnv?: NodeJS.ProcessEnv;
  /**
   * `node` arguments that run the service, before `--role` (default: main.ts through tsx).
   * The bench runs its esbuild bundle on plain node, as `npm start` does, with its own flags.
   */
  readonly entry?: readonly string[];
  /** Working directory (default: this checkout's root; the bench's `--service-compare` runs another's). */
  readonly cwd?: string;
  /**
   * In a session and process group of its own (default true): a terminal's Ctrl-C reaches the
   * runner only, which stops the roles in order. Linux's autogroup scheduler also gives a
   * session its own CPU share, so a measurement that must share the CPU as one group (the
   * bench: service, nats-server and load generator) says false.
   */
  readonly detached?: boolean;
}

export interface GatewayPorts {
  readonly task: number;
  readonly job: number;
  readonly microvm: number;
}

export interface RoleProcess extends NodeProcess {
  readonly role: RoleSet;
  /** Where a gateway listens (a process with the gateway role only). */
  readonly ports?: GatewayPorts;
}

/** Starts `main.ts --role <role>` (in its own process group, unless told) and waits for its "ready" log line. */
export async function startRole(options: RoleProcessOptions): Promise<RoleProcess> {
  const role = typeof options.role === "string" ? options.role : options.role.join(",");
  const proc = await startNodeProcess({
    name: options.name,
    args: [...(options.entry ?? FROM_SOURCE), "--role", role],
    cwd: options.cwd ?? root,
    detached: options.detached ?? true,
    env: {
      ...(options.baseEnv ?? process.env),
      LOG_LEVEL: "info", // readiness is read from the info lines
      ...options.env,
      NATS_URL: options.natsUrl,
      DATA_DIR: options.dataDir,
      [RUN_MARKER]: options.runDir,
    },
    onLine: options.onLine,
    readyTimeoutMs: options.readyTimeoutMs,
    onSpawn: options.onSpawn,
  });
  const listening = proc.startup.find((entry) => entry.msg === "gateway listening");
  const ports = listening && {
    task: Number(listening.taskPort),
    job: Number(listening.jobPort),
    microvm: Number(listening.microvmPort),
  };
  return { ...proc, role: options.role, ...(ports ? { ports } : {}) };
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
  for (const pid of recorded) if (belongsTo(pid, runDir)) ours.push(pid);
  for (const pid of ours) signal(pid, "SIGTERM");
  for (let i = 0; i < 50 && ours.some(running); i++) await new Promise((r) => setTimeout(r, 100));
  for (const pid of ours.filter(running)) signal(pid, "SIGKILL");
  return ours;
}

/**
 * Whether `pid` is a process of the run in `runDir` (pids get reused): its environment carries
 * the run directory, or its command line names it. Synchronous, for exit handlers.
 */
export function belongsTo(pid: number, runDir: string): boolean {
  const read = (file: string) => {
    try {
      return readFileSync(`/proc/${pid}/${file}`, "utf8");
    } catch {
      return "";
    }
  };
  return read("environ").split("\0").includes(`${RUN_MARKER}=${runDir}`) || read("cmdline").includes(join(runDir, "/"));
}

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Sends `name` to `pid`, if it still exists. */
export function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    /* already gone */
  }
}

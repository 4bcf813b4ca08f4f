// A node child process that says it is ready with a JSON log line `{"msg":"ready",...}` on
// stdout: the service (main.ts, see roles.ts) and the bench's own servers. Spawned, read line
// by line to the end (the pipes never fill), and stopped with SIGTERM then SIGKILL.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";

export interface NodeProcessOptions {
  readonly name: string;
  /** Arguments of `node`: its flags, the entry, then the entry's own arguments. */
  readonly args: readonly string[];
  /** The process's whole environment. */
  readonly env: NodeJS.ProcessEnv;
  readonly cwd: string;
  /**
   * In a session and process group of its own: a terminal's Ctrl-C reaches the parent only, which stops it in order.
   */
  readonly detached?: boolean;
  /** Every output line: JSON logs on stdout, anything on stderr. */
  readonly onLine?: (name: string, line: string) => void;
  readonly readyTimeoutMs?: number;
  /** Called with the pid right after the spawn (to record it before anything can fail). */
  readonly onSpawn?: (pid: number) => void;
}

export interface NodeProcess {
  readonly name: string;
  readonly pid: number;
  readonly child: ChildProcess;
  /** The JSON log entries it wrote up to and including "ready" (a gateway's ports are in there). */
  readonly startup: readonly Record<string, unknown>[];
  /** Its last output lines, for error messages. */
  output(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  stop(graceMs?: number): Promise<void>;
}

const TAIL_LINES = 20;

/** Spawns `node <args>` and resolves once it logs "ready"; an exit or a timeout first rejects (and kills it). */
export async function startNodeProcess(options: NodeProcessOptions): Promise<NodeProcess> {
  const child = spawn(process.execPath, [...options.args], {
    cwd: options.cwd,
    env: options.env,
    detached: options.detached === true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const exited = once(child, "exit");
  if (child.pid) options.onSpawn?.(child.pid);
  const tail: string[] = [];
  const startup: Record<string, unknown>[] = [];
  const onLine = (line: string) => {
    tail.push(line);
    if (tail.length > TAIL_LINES) tail.shift();
    options.onLine?.(options.name, line);
  };
  const output = () => tail.join("\n");
  createInterface({ input: child.stderr! }).on("line", onLine);
  await new Promise<void>((resolve, reject) => {
    let ready = false;
    const timeoutMs = options.readyTimeoutMs ?? 60_000;
    const timer = setTimeout(
      () => reject(new Error(`${options.name} not ready after ${timeoutMs} ms:\n${output()}`)),
      timeoutMs,
    );
    createInterface({ input: child.stdout! }).on("line", (line) => {
      onLine(line);
      const entry = ready ? undefined : parseLog(line);
      if (!entry) return;
      startup.push(entry);
      if (entry.msg !== "ready") return;
      ready = true;
      clearTimeout(timer);
      resolve();
    });
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(new Error(`${options.name} could not be started: ${err.message}`, { cause: err }));
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${options.name} exited (${code ?? signal}) before it was ready:\n${output()}`));
    });
  }).catch(async (err: unknown) => {
    if (child.pid && child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    if (child.pid) await exited;
    throw err;
  });
  const stop = async (graceMs = 10_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  };
  return { name: options.name, pid: child.pid!, child, startup, output, stop };
}

function parseLog(line: string): Record<string, unknown> | undefined {
  if (!line.startsWith("{")) return undefined;
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

// Runs `main.ts` as a real child process and reads its readiness from the JSON logs.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
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

export async function startServiceProcess(env: Record<string, string>, args: string[] = []): Promise<ServiceProcess> {
  // Without a DATA_DIR of its own, a process with the microvms role would keep its token key and
  // instance bundles in the repository's `.data`, shared by every test process.
  const ownDataDir = env.DATA_DIR ? undefined : mkdtempSync(join(tmpdir(), "svc-proc-"));
  const child = spawn(process.execPath, ["--import", "tsx", "main.ts", ...args], {
    cwd: root,
    env: {
      ...process.env,
      TASK_API_PORT: "0",
      JOB_API_PORT: "0",
      MICROVM_API_PORT: "0",
      LOG_LEVEL: "info",
      ...(ownDataDir ? { DATA_DIR: ownDataDir } : {}),
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  if (ownDataDir) child.once("exit", () => rmSync(ownDataDir, { recursive: true, force: true }));
  const logs: Record<string, unknown>[] = [];
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const ready = new Promise<Record<string, unknown>>((resolve, reject) => {
    let listening: Record<string, unknown> = {};
    createInterface({ input: child.stdout! }).on("line", (line) => {
      try {
        const entry = JSON.parse(line) as Record<string, unknown>;
        logs.push(entry);
        if (entry.msg === "gateway listening") listening = entry;
        if (entry.msg === "ready") resolve(listening);
      } catch {
        /* not a log line */
      }
    });
    child.once("exit", (code) => reject(new Error(`service exited (${code}): ${stderr}`)));
    setTimeout(() => reject(new Error(`service not listening after 30 s: ${stderr}`)), 30_000).unref();
  });
  const listening = await ready.catch((err) => {
    child.kill("SIGKILL");
    throw err;
  });
  const exit = once(child, "exit");
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

/** True while a process with `pid` runs (a zombie waiting for its reaper counts as gone). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

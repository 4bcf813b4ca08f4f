// Every process the benchmark starts, tracked by pid so each one is stopped at the end,
// on error and on Ctrl-C: the private nats-server, the service, the bare node:http server.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { startNatsServer, type NatsServer } from "../platform/index.ts";

export const root = fileURLToPath(new URL("..", import.meta.url));

export interface Child {
  readonly name: string;
  readonly pid: number;
  readonly process: ChildProcess;
  /** The last few KiB the process printed, for error messages. */
  output(): string;
}

const running = new Map<number, Child>();

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function track(name: string, process: ChildProcess): Child {
  let output = "";
  const keep = (chunk: Buffer) => (output = (output + chunk.toString()).slice(-4096));
  process.stdout?.on("data", keep);
  process.stderr?.on("data", keep);
  const child = { name, pid: process.pid!, process, output: () => output };
  running.set(child.pid, child);
  process.once("exit", () => running.delete(child.pid));
  return child;
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once the process has exited. */
export async function stopChild(child: Child, graceMs = 5_000): Promise<void> {
  if (exited(child.process)) return;
  const done = once(child.process, "exit");
  child.process.kill("SIGTERM");
  const timer = setTimeout(() => child.process.kill("SIGKILL"), graceMs);
  await done;
  clearTimeout(timer);
}

/** Stops every child still running, the service before nats-server. */
export async function stopAll(graceMs = 5_000): Promise<void> {
  const order = [...running.values()].sort((a, b) => Number(a.name === "nats-server") - Number(b.name === "nats-server"));
  for (const child of order) await stopChild(child, graceMs);
}

/** Children that were started and have exited since, with how they ended. */
export function exitedChildren(children: Child[]): string[] {
  return children
    .filter((child) => exited(child.process))
    .map((child) => `${child.name} (pid ${child.pid}) exited with ${child.process.exitCode ?? child.process.signalCode}`);
}

/** Last resort on process exit: SIGKILL whatever is still running. */
export function killAllSync(): void {
  for (const child of running.values()) {
    if (!exited(child.process)) child.process.kill("SIGKILL");
  }
}

export async function startNats(storeDir: string): Promise<{ server: NatsServer; child: Child }> {
  const server = await startNatsServer({ storeDir });
  return { server, child: track("nats-server", server.process) };
}

/** Runs a TypeScript entry in its own node process (tsx as a loader, so the pid is node's). */
/**
 * Bundles `entry` with esbuild (dependencies stay in node_modules) and runs it on plain
 * `node`, as `npm start` runs the service: no TypeScript loader in the measured process.
 */
export async function spawnBuilt(name: string, entry: string, args: string[], env: NodeJS.ProcessEnv, nodeFlags: string[] = []): Promise<Child> {
  const outfile = join(root, "dist", `${basename(entry, ".ts")}.mjs`);
  await build({ entryPoints: [join(root, entry)], bundle: true, platform: "node", format: "esm", target: "node20", packages: "external", outfile, logLevel: "warning" });
  const process_ = spawn(process.execPath, [...nodeFlags, outfile, ...args], {
    cwd: root,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  return track(name, process_);
}

/** Polls `url` until it answers at all (any status); fails if `child` exits first. */
export async function waitForHttp(url: string, child: Child, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (exited(child.process)) throw new Error(`${child.name} exited (${child.process.exitCode}):\n${child.output().trim()}`);
    const answered = await fetch(url, { signal: AbortSignal.timeout(1_000) }).then(
      async (res) => (await res.arrayBuffer(), true),
      () => false,
    );
    if (answered) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${child.name} did not answer at ${url} within ${timeoutMs} ms:\n${child.output().trim()}`);
}

// `npm run bench -- --cli`: what a `taskctl` call costs on top of starting node. Each command
// runs `runs` times, the commands interleaved (so a busy spell of the machine hits them all),
// and the table gives each one's median wall time beside a bare `node -e 0`'s median.
// `taskctl` rows run the installed command's file, client/cli-bin.mjs, with node.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createServer } from "node:net";
import { root } from "./children.ts";
import { saveResults } from "./results.ts";
import { median } from "./stats.ts";

interface CliRow {
  command: string;
  medianMs: number;
  /** Its median minus `node -e 0`'s median. */
  overNodeMs: number;
  samplesMs: number[];
}

/** A port nothing listens on: a `tasks get` there fails at connect, so the row is the CLI alone. */
async function closedPort(): Promise<number> {
  const server = createServer().listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as { port: number };
  server.close();
  await once(server, "close");
  return port;
}

/** Wall time of one run of `command` (node's arguments, or a command line of its own), spawn to exit, in ms. */
async function timed(command: string[]): Promise<number> {
  const [file, ...args] = command[0] === "npx" ? command : [process.execPath, ...command];
  const started = process.hrtime.bigint();
  const child = spawn(file!, args, { cwd: root, stdio: "ignore" });
  await once(child, "exit");
  return Number(process.hrtime.bigint() - started) / 1e6;
}

export async function runCliBench(runs: number, header: Record<string, unknown>, startedAt: Date): Promise<void> {
  const url = `http://127.0.0.1:${await closedPort()}`;
  const commands: [string, string[]][] = [
    ["node -e 0", ["-e", "0"]],
    ["taskctl --help", ["client/cli-bin.mjs", "--help"]],
    ["npx taskctl --help (npm's own start on top)", ["npx", "taskctl", "--help"]],
    [`taskctl tasks get x --url ${url} (closed port)`, ["client/cli-bin.mjs", "tasks", "get", "x", "--url", url]],
    [
      "the same through tsx (before: TypeScript compiled per call)",
      ["--import", "tsx", "client/cli.ts", "tasks", "get", "x", "--url", url],
    ],
  ];
  await timed(commands[1]![1]); // builds dist/taskctl.mjs if it is stale: not a sample
  const samples = commands.map((): number[] => []);
  for (let i = 0; i < runs; i++) for (const [n, [, args]] of commands.entries()) samples[n]!.push(await timed(args));
  const node = median(samples[0]!);
  const rows: CliRow[] = commands.map(([command], n) => ({
    command,
    medianMs: median(samples[n]!),
    overNodeMs: median(samples[n]!) - node,
    samplesMs: samples[n]!,
  }));
  console.log(`\nmedian wall time of ${runs} runs each, interleaved:\n`);
  const width = Math.max(...rows.map((r) => r.command.length));
  console.log(`${"command".padEnd(width)}  median ms  over node -e 0`);
  for (const r of rows)
    console.log(
      `${r.command.padEnd(width)}  ${r.medianMs.toFixed(0).padStart(9)}  ${r.overNodeMs.toFixed(0).padStart(14)}`,
    );
  await saveResults({ ...header, runs, rows }, startedAt, "cli");
}

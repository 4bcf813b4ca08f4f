// taskctl in the test's own process: what it prints and the status it exits with.
import { runCli } from "../../client/cli.ts";

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs one command line with exactly `env` as its environment. */
export async function runTaskctl(args: string[], env: Record<string, string>): Promise<CliRun> {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    out: (text) => void (stdout += `${text}\n`),
    err: (text) => void (stderr += `${text}\n`),
    env,
  });
  return { code, stdout, stderr };
}

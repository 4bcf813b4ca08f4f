// What a person sees on a terminal (a pseudo-terminal made by util-linux `script`): readable log
// lines, the URLs and "Ctrl-C to stop"; `LOG_FORMAT=json` keeps JSON there too. Without a
// terminal the lines are JSON: every test that reads a service's logs relies on it.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { serviceDataDir } from "./helpers/process.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const hasScript = (() => {
  try {
    execFileSync("script", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

/** Runs `npm start`'s main.ts on a pseudo-terminal until `until` is printed; returns the output (escapes stripped). */
async function onTerminal(env: Record<string, string>, until: RegExp): Promise<string> {
  const command = `${JSON.stringify(process.execPath)} --import tsx main.ts`;
  const child = spawn("script", ["-qec", command, "/dev/null"], {
    cwd: root,
    env: {
      ...process.env,
      TASK_API_PORT: "0",
      JOB_API_PORT: "0",
      MICROVM_API_PORT: "0",
      LOG_LEVEL: "info",
      NATS_URL: "",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const exit = once(child, "exit");
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout!.on("data", (d: Buffer) => {
        // biome-ignore lint/suspicious/noControlCharactersInRegex: strips the terminal's ANSI colour codes
        output = (output + d.toString()).replace(/\x1b\[[0-9;]*m/g, "").replace(/\r/g, "");
        if (until.test(output)) resolve();
      });
      child.once("exit", () => reject(new Error(`exited before ${until}:\n${output}`)));
    });
  } finally {
    child.kill("SIGTERM"); // the terminal closes: the service gets SIGHUP and stops
    await exit;
  }
  return output;
}

describe("terminal output", { skip: hasScript ? false : "needs util-linux `script` for a pseudo-terminal" }, () => {
  it("terminal output - on a terminal: readable lines with times, the URLs and Ctrl-C to stop", async (t) => {
    const output = await onTerminal({ DATA_DIR: await serviceDataDir(t) }, /Ctrl-C to stop/);
    const lines = output.split("\n");
    assert.ok(!lines.some((l) => l.startsWith("{")), `no JSON lines:\n${output}`);
    assert.ok(
      lines.some((l) => /^\[\d\d:\d\d:\d\d\.\d{3}\] INFO: ready /.test(l)),
      `a readable ready line:\n${output}`,
    );
    assert.match(output, /^Task API +http:\/\/127\.0\.0\.1:\d+ /m);
    assert.match(output, /^Job API +http:\/\/127\.0\.0\.1:\d+$/m);
    assert.match(output, /^microVM API +http:\/\/127\.0\.0\.1:\d+$/m);
    assert.match(output, /^NATS +nats:\/\/127\.0\.0\.1:\d+$/m);
  });

  it("terminal output - LOG_FORMAT=json keeps JSON lines on a terminal, without the welcome", async (t) => {
    const output = await onTerminal({ DATA_DIR: await serviceDataDir(t), LOG_FORMAT: "json" }, /"msg":"ready"/);
    const lines = output.split("\n").filter(Boolean);
    for (const line of lines) assert.doesNotThrow(() => JSON.parse(line), line);
    assert.doesNotMatch(output, /Ctrl-C to stop/);
  });
});

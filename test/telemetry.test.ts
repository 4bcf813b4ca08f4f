// Installing the project sends no telemetry. swagger-ui-dist depends on @scarf/scarf, whose
// install script reports the install to scarf.sh; npm 11.19 runs no dependency's script
// unless `allowScripts` allows it, older npm runs it, and then `scarfSettings.enabled: false`
// in package.json is what stops it (scarf's documented opt-out).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const root = fileURLToPath(new URL("..", import.meta.url));
const packageJson = JSON.parse(await readFile(join(root, "package.json"), "utf8")) as {
  scarfSettings?: { enabled?: unknown };
  allowScripts?: Record<string, unknown>;
};

// Runs scarf's own install script as an npm without `allowScripts` would, its dependency tree
// given (`npm ls` takes longer here than the script's own 3 s bound for it) and its reports
// sent to `SCARF_LOCAL_PORT` instead of scarf.sh. Prints the script's outcome.
const runReport = `
const scarf = require(process.argv[1]);
const tree = require("fs").readFileSync(0, "utf8");
scarf.getDependencyInfo = () => new Promise((resolve, reject) => scarf.processDependencyTreeOutput(resolve, reject)(null, tree, ""));
scarf.reportPostInstall().then(() => console.log("reported"), (err) => console.log("not reported: " + err.message));
`;

describe("telemetry", () => {
  it("telemetry - package.json opts out of scarf, and npm runs none of its scripts", () => {
    assert.deepEqual(packageJson.scarfSettings, { enabled: false });
    assert.equal(packageJson.allowScripts?.["@scarf/scarf"], false);
  });

  it("telemetry - scarf's install script finds the opt-out and sends nothing", async (t) => {
    const report = join(root, "node_modules/@scarf/scarf/report.js");
    const tree = await promisify(execFile)("npm", ["ls", "@scarf/scarf", "--json", "--long"], {
      cwd: root,
      maxBuffer: 64 * 1024 * 1024,
    });
    const received: string[] = [];
    const server = createServer((req, res) => {
      received.push(`${req.method} ${req.url}`);
      res.end();
    });
    await new Promise<void>((resolve) => server.listen(0, "localhost", resolve));
    t.after(() => server.close());
    // Its rate-limit file goes to TMPDIR; none of the user's opt-outs in the environment counts.
    const scratch = await mkdtemp(join(tmpdir(), "scarf-"));
    t.after(() => rm(scratch, { recursive: true, force: true }));
    const { SCARF_ANALYTICS, SCARF_NO_ANALYTICS, DO_NOT_TRACK, ...env } = process.env;
    const child = spawn(process.execPath, ["-e", runReport, report], {
      cwd: join(root, "node_modules/@scarf/scarf"),
      env: {
        ...env,
        INIT_CWD: root,
        npm_config_global: "",
        SCARF_LOCAL_PORT: String((server.address() as AddressInfo).port),
        TMPDIR: scratch,
      },
      stdio: ["pipe", "pipe", "inherit"],
    });
    child.stdin.end(tree.stdout);
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    const code = await new Promise((resolve) => child.once("close", resolve));
    assert.equal(code, 0, output);
    // Its own words for the two checks of `enabled: false`: the chain of packages, the user's choice.
    assert.match(output.trim(), /^not reported: (Scarf has been disabled via a package\.json|User has opted out)/);
    assert.deepEqual(received, [], "no request reached the reporting endpoint");
  });
});

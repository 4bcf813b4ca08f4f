// What the CLI loads: its module graph (every static and dynamic import, as the bundle build
// sees it) holds no module of the gateway, the actors or the microVM host; the CLI talks to
// the service only through the contracts and the clients.
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

/** The CLI's bundle as `npm run build` makes it (entry, splitting, plugins). */
interface BundleSpec extends esbuild.BuildOptions {
  readonly entry: string;
  readonly out: string;
}

const root = fileURLToPath(new URL("..", import.meta.url));
/** Server-side folders: the CLI must not load a module of these. */
const SERVER_SIDE = ["gateway/", "actors/", "vm-runtime/host/", "vm-runtime/service/", "vm-runtime/registry/"];

test("cli - its module graph holds no gateway, actor or microVM host module", async () => {
  const { bundles } = (await import(`${root}scripts/build.mjs`)) as { bundles: { taskctl: BundleSpec } };
  const { entry, out: _out, ...options } = bundles.taskctl;
  const result = await esbuild.build({
    ...options,
    absWorkingDir: root,
    entryPoints: { taskctl: entry },
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    outdir: "dist",
    outExtension: { ".js": ".mjs" },
    write: false,
    metafile: true,
    logLevel: "silent",
  });
  await esbuild.stop();
  const loaded = Object.keys(result.metafile!.inputs);
  assert.ok(loaded.includes("client/cli.ts") && loaded.includes("client/cli-images.ts"), "the graph is the CLI's");
  const serverSide = loaded.filter((path) => SERVER_SIDE.some((folder) => path.startsWith(folder)));
  assert.deepEqual(serverSide, []);
});

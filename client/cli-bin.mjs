#!/usr/bin/env node
// `taskctl` (package.json "bin"): runs the CLI's esbuild bundle, dist/taskctl.mjs, on plain node.
// `npm install` and `npm run build` write it; when it is missing or older than one of its
// source files (an edited checkout), it is built again first (esbuild, a fraction of a second).
import { readFileSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const bundle = `${root}dist/taskctl.mjs`;

/** True when the bundle is absent or a file it was built from changed since. */
function stale() {
  try {
    const built = statSync(bundle).mtimeMs;
    const inputs = JSON.parse(readFileSync(`${bundle}.inputs.json`, "utf8"));
    // A source file removed since counts as changed (Infinity).
    return inputs.some(
      (input) => (statSync(`${root}${input}`, { throwIfNoEntry: false })?.mtimeMs ?? Infinity) > built,
    );
  } catch {
    return true;
  }
}

if (stale()) {
  const { buildBundle, bundles } = await import("../scripts/build.mjs");
  const esbuild = await import("esbuild");
  await buildBundle(bundles.taskctl).finally(() => esbuild.stop());
}
const { main } = await import(bundle);
await main(process.argv.slice(2));

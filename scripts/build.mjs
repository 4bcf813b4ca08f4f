// The esbuild bundles `npm start` and `taskctl` run on plain node: dist/main.mjs (the service)
// and dist/taskctl.mjs (the CLI), with the source files of each listed beside it so the CLI's
// launcher can tell a stale bundle. `node scripts/build.mjs` (npm run build) writes both.
import { rename, writeFile, mkdir } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import * as esbuild from "esbuild";

const root = fileURLToPath(new URL("..", import.meta.url));

/** The bundles: entry (relative to the repository) → output under dist/. */
export const bundles = {
  main: { entry: "main.ts", out: "dist/main.mjs", packages: "external" },
  // Every call of the CLI loads it: its dependencies are in the one file (resolving them from
  // node_modules one by one took a third of a second), except esbuild, which runs a binary and
  // is loaded only when called (the CLI reaches it through vm-runtime's index, never calls it).
  taskctl: {
    entry: "client/cli.ts",
    out: "dist/taskctl.mjs",
    plugins: [lazyEsbuild()],
    minifyWhitespace: true,
    minifySyntax: true,
    // The CommonJS dependencies inside call `require` for node's own modules.
    banner: { js: 'import { createRequire } from "node:module"; const require = createRequire(import.meta.url);' },
  },
};

/** `import { build } from "esbuild"` as a function that loads esbuild on its first call. */
function lazyEsbuild() {
  return {
    name: "lazy-esbuild",
    setup(build) {
      build.onResolve({ filter: /^esbuild$/ }, (args) =>
        args.namespace === "lazy-esbuild"
          ? { path: "esbuild", external: true }
          : { path: "esbuild", namespace: "lazy-esbuild" },
      );
      build.onLoad({ filter: /.*/, namespace: "lazy-esbuild" }, () => ({
        contents: 'export const build = async (...args) => (await import("esbuild")).build(...args);',
        loader: "js",
      }));
    },
  };
}

/** Builds one bundle; written under a temporary name and renamed, so a reader never sees half a file. */
export async function buildBundle({ entry, out, ...options }) {
  const result = await esbuild.build({
    absWorkingDir: root,
    entryPoints: [entry],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    write: false,
    metafile: true,
    outfile: out,
    logLevel: "warning",
    ...options,
  });
  await mkdir(join(root, "dist"), { recursive: true });
  // Files only: a plugin's module (`lazy-esbuild:esbuild`) has no file to compare.
  const inputs = Object.keys(result.metafile.inputs).filter((input) => !/^[\w-]+:/.test(input));
  const target = join(root, out);
  const temporary = `${target}.${process.pid}.tmp`;
  await writeFile(`${temporary}.inputs`, JSON.stringify(inputs));
  await rename(`${temporary}.inputs`, `${target}.inputs.json`);
  await writeFile(temporary, result.outputFiles[0].contents);
  await rename(temporary, target);
}

/** Builds every bundle; esbuild's helper process is stopped after, so nothing outlives the build. */
export async function buildAll() {
  try {
    await Promise.all(Object.values(bundles).map(buildBundle));
  } finally {
    await esbuild.stop();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await buildAll();

// The esbuild bundles `npm start` and `taskctl` run on plain node: dist/main.mjs (the service)
// and dist/taskctl.mjs (the CLI, with the chunks its commands load on use beside it,
// dist/taskctl.*-<hash>.mjs), with the source files of each listed beside it so the CLI's
// launcher can tell a stale bundle. `node scripts/build.mjs` (npm run build) writes both.
import { existsSync } from "node:fs";
import { mkdir, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { basename, dirname, join } from "node:path";
import * as esbuild from "esbuild";

const root = fileURLToPath(new URL("..", import.meta.url));

/** The bundles: entry (relative to the repository) → output under dist/. */
export const bundles = {
  main: { entry: "main.ts", out: "dist/main.mjs", packages: "external" },
  // Every call of the CLI loads it: its dependencies are bundled (resolving them from
  // node_modules one by one took a third of a second), except esbuild, which runs a binary and
  // is loaded only when called (by `image push`). Split at the CLI's dynamic imports: help and
  // usage errors load the entry alone, a command over HTTP adds the contracts and the client,
  // --nats adds the NATS client. Project sources count as free of side effects, so importing a
  // folder's index.ts brings only the modules of the names used (not Ajv, pino, prom-client).
  taskctl: {
    entry: "client/cli.ts",
    out: "dist/taskctl.mjs",
    splitting: true,
    plugins: [lazyEsbuild(), projectSourcesWithoutSideEffects()],
    minify: true,
    // Function and class names stay as written: errors are told apart by `name`, which a library
    // may take from its class.
    keepNames: true,
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

/**
 * The repository's own source files as free of side effects (esbuild's `sideEffects: false`):
 * a module none of whose names is used is left out. Modules that are used keep every statement.
 */
function projectSourcesWithoutSideEffects() {
  return {
    name: "project-sources-without-side-effects",
    setup(build) {
      build.onResolve({ filter: /^\.\.?\// }, async ({ path, importer, resolveDir, kind, pluginData }) => {
        if (pluginData?.resolving) return undefined;
        const resolved = await build.resolve(path, { importer, resolveDir, kind, pluginData: { resolving: true } });
        if (resolved.errors.length > 0 || resolved.external || resolved.path.includes("/node_modules/"))
          return undefined;
        return { path: resolved.path, namespace: resolved.namespace, sideEffects: false };
      });
    },
  };
}

/** Writes a file under a temporary name and renames it, so a reader never sees half of it. */
async function writeWhole(target, contents) {
  const temporary = `${target}.${process.pid}.tmp`;
  await writeFile(temporary, contents);
  await rename(temporary, target);
}

/**
 * Builds one bundle. With `splitting`, the chunks (content-hashed names) are written before the
 * entry, and chunks no build wrote for a minute are removed: a CLI still running from the
 * previous entry may yet load its chunks.
 */
export async function buildBundle({ entry, out, splitting = false, ...options }) {
  const name = basename(out, ".mjs");
  const result = await esbuild.build({
    absWorkingDir: root,
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    write: false,
    metafile: true,
    logLevel: "warning",
    ...(splitting
      ? {
          splitting,
          entryPoints: { [name]: entry },
          outdir: dirname(out),
          entryNames: "[name]",
          // Beside the entry, not in a folder: modules find package.json one level up.
          chunkNames: `${name}.[name]-[hash]`,
          outExtension: { ".js": ".mjs" },
        }
      : { entryPoints: [entry], outfile: out }),
    ...options,
  });
  const target = join(root, out);
  const files = result.outputFiles.filter((file) => file.path !== target);
  const written = new Set(files.map((file) => file.path));
  await mkdir(join(root, dirname(out)), { recursive: true });
  for (const file of files) await writeWhole(file.path, file.contents);
  // The repository's files (not a plugin's module, `lazy-esbuild:esbuild`), and for the packages
  // the lock file npm writes into node_modules on every install: one file to compare, not hundreds.
  const installed = "node_modules/.package-lock.json";
  const packages = Object.keys(result.metafile.inputs).filter((input) => input.startsWith("node_modules/"));
  const inputs = Object.keys(result.metafile.inputs).filter(
    (input) => !/^[\w-]+:/.test(input) && !input.startsWith("node_modules/"),
  );
  inputs.push(...(existsSync(join(root, installed)) ? [installed] : packages));
  await writeWhole(`${target}.inputs.json`, JSON.stringify(inputs));
  await writeWhole(target, result.outputFiles.find((file) => file.path === target).contents);
  if (splitting) await removeOldChunks(dirname(target), `${name}.`, written);
}

async function removeOldChunks(dir, prefix, written) {
  for (const file of await readdir(dir)) {
    const path = join(dir, file);
    if (!file.startsWith(prefix) || !/-[A-Z0-9]{8}\.mjs$/.test(file) || written.has(path)) continue;
    const { mtimeMs } = await stat(path).catch(() => ({ mtimeMs: Date.now() }));
    if (Date.now() - mtimeMs > 60_000) await rm(path, { force: true });
  }
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

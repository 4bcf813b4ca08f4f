// esbuild runs: the runtime boot as one self-contained .mjs (built once per provider) that
// imports the image module named by MICROVM_IMAGE_MODULE, so an instance runs on plain `node`
// under the permission model (tsx needs workers, fs writes and a child process, all of which
// the sandbox forbids); an image file as one self-contained module (client/image-module.ts)
// written to disk; both in one for benches.
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { BOOTED_LINE, LOADED_LINE } from "../runtime/boot.ts";
import { CPUS_ENV } from "../runtime/cpu-count.ts";
import { LAUNCH_TEMPLATE_LINE } from "../runtime/startup-input.ts";
import { vmRuntimeFile } from "./source-dir.ts";
import { bundleImageModule, REQUIRE_SHIM } from "../client/image-module.ts";

const BOOT_MODULE = vmRuntimeFile("runtime/boot.ts");
const IMPORT_CHECK_MODULE = vmRuntimeFile("runtime/module-imports.ts");
const STARTUP_INPUT_MODULE = vmRuntimeFile("runtime/startup-input.ts");

/** How both entries start the runtime, once `image`, `port`, `socketPath` and `accessSecret` are known. */
const BOOT_CALL =
  "await bootRuntime(image, { port, socketPath, exitWhenStdinEnds: true, " +
  "...(accessSecret ? { accessSecret } : {}) });";

/** Environment variable naming the image module the runtime bundle imports. */
export const IMAGE_MODULE_ENV = "MICROVM_IMAGE_MODULE";

/**
 * Bundles the runtime boot into `outDir/runtime.mjs`: it imports the image module named by
 * `MICROVM_IMAGE_MODULE` at start, so one bundle serves every image and a new image costs no
 * esbuild run on the launch path. Returns the file path.
 */
export async function bundleRuntime(outDir: string): Promise<string> {
  return bundleEntry(runtimeEntrySource(), join(outDir, "runtime.mjs"), outDir);
}

/**
 * Bundles `imageModule` (absolute or cwd-relative path) and the runtime into one file in
 * `outDir`, the module inlined (what a runtime started by hand runs); returns the file path.
 */
export async function bundleImage(imageModule: string, outDir: string): Promise<string> {
  const imagePath = resolve(imageModule);
  const name = createHash("sha256").update(imagePath).digest("hex").slice(0, 16);
  return bundleEntry(entrySource(JSON.stringify(imagePath)), join(outDir, `image-${name}.mjs`), outDir);
}

/** `imageModule` bundled by `bundleImageModule` into `outfile`. */
export async function writeImageModule(imageModule: string, outfile: string): Promise<string> {
  await writeFile(outfile, await bundleImageModule(imageModule), { mode: 0o644 });
  return outfile;
}

async function bundleEntry(contents: string, outfile: string, outDir: string): Promise<string> {
  await mkdir(outDir, { recursive: true });
  await build({
    stdin: { contents, resolveDir: outDir, sourcefile: "microvm-entry.ts", loader: "ts" },
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    outfile,
    banner: { js: REQUIRE_SHIM },
    logLevel: "silent",
    legalComments: "none",
  });
  return outfile;
}

/**
 * The runtime's entry for a module named at start or sent on stdin; it prints `BOOTED_LINE`
 * before it reads the module. Before anything of the module runs, or anything it names is
 * resolved, its source is lexed here, inside the instance, and any
 * import that is not a node builtin ends the instance with one `ImageError:` line on stderr
 * (module-imports.ts). CommonJS code bundled into an ES module may call `require` for a node
 * builtin, which the one-file bundle gave it in scope; a global `require` does the same for a
 * module loaded on its own, and loads nothing else.
 */
function runtimeEntrySource(): string {
  return [
    `import { readFileSync, writeFileSync } from "node:fs";`,
    `import { pathToFileURL } from "node:url";`,
    `import { builtinRequire, checkModuleImports, ImageError, importCheckReady } from ${JSON.stringify(IMPORT_CHECK_MODULE)};`,
    `import { StartupInput } from ${JSON.stringify(STARTUP_INPUT_MODULE)};`,
    `import { refreshEntropy } from ${JSON.stringify(vmRuntimeFile("runtime/fresh-entropy.ts"))};`,
    `import { bootRuntime } from ${JSON.stringify(BOOT_MODULE)};`,
    `import { warmRuntime } from ${JSON.stringify(vmRuntimeFile("runtime/warm-up.ts"))};`,
    `import { isImage } from ${JSON.stringify(vmRuntimeFile("image.ts"))};`,
    `import { countCpusAs } from ${JSON.stringify(vmRuntimeFile("runtime/cpu-count.ts"))};`,
    // The CPUs the instance counts are its quota's, before anything of the image runs.
    `countCpusAs(process.env.${CPUS_ENV});`,
    "const input = new StartupInput();",
    "const firstLine = await input.line();",
    // A launch snapshot's template: the image is imported with no secret and no id, and the
    // host saves it once it prints LOADED_LINE; each restore of it is told its identity.
    `const template = firstLine === ${JSON.stringify(LAUNCH_TEMPLATE_LINE)};`,
    'let accessSecret = template ? "" : firstLine;',
    `let imageModule = process.env.${IMAGE_MODULE_ENV};`,
    // Image code sees the environment it saw when it was bundled in: no host path in it.
    `delete process.env.${IMAGE_MODULE_ENV};`,
    // A wall booted ahead: what every instance needs on its first call is loaded while it waits.
    'if (!imageModule) await warmRuntime(process.env.HOME || "/scratch");',
    "await importCheckReady;",
    // The host blames a start that fails before this line on itself, after it on the image.
    `process.stdout.write(${JSON.stringify(`${BOOTED_LINE}\n`)});`,
    "if (!imageModule) {",
    // A wall started before its image: the host sends the instance's id and module on stdin.
    "  const assignment = await input.assignment();",
    "  if (!template) process.env.MICROVM_ID = assignment.microvmId;",
    `  imageModule = (process.env.HOME || "/scratch") + "/.microvm-image.mjs";`,
    "  writeFileSync(imageModule, assignment.module);",
    "}",
    "if (!template) input.release();",
    "try {",
    '  checkModuleImports(readFileSync(imageModule, "utf8"));',
    "} catch (error) {",
    "  if (!(error instanceof ImageError)) throw error;",
    // One line, then exit: the host's 400 quotes it (stderr is synchronous on a pipe).
    `  process.stderr.write("ImageError: " + error.message + "\\n");`,
    "  process.exit(1);",
    "}",
    "globalThis.require ??= builtinRequire(pathToFileURL(imageModule));",
    "const socketPath = process.env.MICROVM_RUNTIME_SOCKET || undefined;",
    "const port = Number(process.env.MICROVM_RUNTIME_PORT ?? 0);",
    "const { default: image } = await import(pathToFileURL(imageModule).href);",
    `if (!isImage(image)) throw new TypeError("the image module's default export is not an image (use defineImage)");`,
    "if (template) {",
    `  process.stdout.write(${JSON.stringify(`${LOADED_LINE}\n`)});`,
    // Saved here; what follows runs once per restored instance.
    "  const identity = await input.identity();",
    "  input.release();",
    "  try {",
    "    refreshEntropy();",
    "  } catch (error) {",
    `    process.stderr.write(String(error) + "\\n");`,
    "    process.exit(1);",
    "  }",
    "  process.env.MICROVM_ID = identity.microvmId;",
    "  accessSecret = identity.secret;",
    "}",
    BOOT_CALL,
  ].join("\n");
}

/**
 * The instance's entry: the secret is read from stdin before the image module is evaluated
 * (a dynamic import of `importee`, an expression), so no image code ever runs while it is reachable.
 */
function entrySource(importee: string): string {
  return [
    `import { bootRuntime, readSecretLine } from ${JSON.stringify(BOOT_MODULE)};`,
    `import { isImage } from ${JSON.stringify(vmRuntimeFile("image.ts"))};`,
    `import { countCpusAs } from ${JSON.stringify(vmRuntimeFile("runtime/cpu-count.ts"))};`,
    `countCpusAs(process.env.${CPUS_ENV});`,
    `const accessSecret = await readSecretLine();`,
    `const socketPath = process.env.MICROVM_RUNTIME_SOCKET || undefined;`,
    `const port = Number(process.env.MICROVM_RUNTIME_PORT ?? 0);`,
    `const { default: image } = await import(${importee});`,
    `if (!isImage(image)) throw new TypeError("the image module's default export is not an image (use defineImage)");`,
    BOOT_CALL,
  ].join("\n");
}

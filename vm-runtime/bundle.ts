// Bundles an image module and the runtime boot into one self-contained .mjs with esbuild, so
// an instance runs on plain `node` under the permission model (tsx needs workers, fs writes
// and a child process, all of which the sandbox forbids).
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { mkdir } from "node:fs/promises";
import { join, resolve } from "node:path";
import { vmRuntimeFile } from "./source-dir.ts";

const BOOT_MODULE = vmRuntimeFile("runtime-boot.ts");

/** A CommonJS dependency bundled into ESM may `require` node builtins: give it a real require. */
const REQUIRE_SHIM = 'import { createRequire as __createRequire } from "node:module";\n' +
  "const require = __createRequire(import.meta.url);";

/** Bundles `imageModule` (absolute or cwd-relative path) into `outDir`; returns the file path. */
export async function bundleImage(imageModule: string, outDir: string): Promise<string> {
  const imagePath = resolve(imageModule);
  const name = createHash("sha256").update(imagePath).digest("hex").slice(0, 16);
  const outfile = join(outDir, `image-${name}.mjs`);
  await mkdir(outDir, { recursive: true });
  await build({
    stdin: { contents: entrySource(imagePath), resolveDir: outDir, sourcefile: "microvm-entry.ts", loader: "ts" },
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

function entrySource(imagePath: string): string {
  return [
    `import image from ${JSON.stringify(imagePath)};`,
    `import { bootRuntime } from ${JSON.stringify(BOOT_MODULE)};`,
    `import { isImage } from ${JSON.stringify(vmRuntimeFile("image.ts"))};`,
    `if (!isImage(image)) throw new TypeError(${JSON.stringify(`${imagePath}: default export is not an image`)});`,
    `const port = Number(process.env.MICROVM_RUNTIME_PORT ?? 0);`,
    `const accessSecret = process.env.MICROVM_RUNTIME_SECRET;`,
    `delete process.env.MICROVM_RUNTIME_SECRET;`,
    `await bootRuntime(image, { port, exitWhenStdinEnds: true, ...(accessSecret ? { accessSecret } : {}) });`,
  ].join("\n");
}

// An image file bundled into the one self-contained ES module `createImage` takes, with esbuild,
// where the image is pushed from (`taskctl image push`) and where the host builds its own images.
import { build } from "esbuild";
import { resolve } from "node:path";

/** A CommonJS dependency bundled into ESM may `require` node builtins: give it a real require. */
export const REQUIRE_SHIM =
  'import { createRequire as __createRequire } from "node:module";\n' +
  "const require = __createRequire(import.meta.url);";

/**
 * One self-contained ES module of an image file and everything it imports (npm packages
 * included; node builtins stay imports): what `createImage` takes as `module`.
 */
export async function bundleImageModule(imageModule: string): Promise<string> {
  const result = await build({
    entryPoints: [resolve(imageModule)],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    write: false,
    // Its own names: the host bundles this module again, under the runtime's banner.
    banner: { js: REQUIRE_SHIM.replaceAll("__createRequire", "__imageCreateRequire") },
    logLevel: "silent",
    legalComments: "none",
    // No path comments: the same source bundles to the same bytes (the same digest) anywhere.
    minifyWhitespace: true,
  });
  return result.outputFiles[0]!.text;
}

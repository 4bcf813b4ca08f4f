// Where vm-runtime's source files are, whether this code runs from source (tsx) or inside
// the bundled service (dist/main.mjs): found by walking up to the project, not from this
// module's own URL, which a bundle changes.
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

function findVmRuntimeDir(start: string): string {
  for (let dir = start; ; dir = dirname(dir)) {
    if (existsSync(join(dir, "runtime", "boot.ts")) && existsSync(join(dir, "image.ts"))) return dir;
    if (existsSync(join(dir, "vm-runtime", "runtime", "boot.ts"))) return join(dir, "vm-runtime");
    if (dirname(dir) === dir) throw new Error(`vm-runtime sources not found above ${start}`);
  }
}

/** Absolute path of the `vm-runtime/` folder. */
export const VM_RUNTIME_DIR = findVmRuntimeDir(dirname(fileURLToPath(import.meta.url)));

/** Absolute path of a file in `vm-runtime/`. */
export const vmRuntimeFile = (file: string): string => join(VM_RUNTIME_DIR, file);

// Absolute module paths of the images shipped with the runtime, for providers to start.
import { fileURLToPath } from "node:url";

const here = (file: string) => fileURLToPath(new URL(file, import.meta.url));

/** `sandbox` is the example image; `probe` and `hog` exist for tests of the sandboxing. */
export const builtinImages = {
  sandbox: here("./sandbox.ts"),
  probe: here("./probe.ts"),
  hog: here("./hog.ts"),
} as const;

// Absolute module paths of the images shipped with the runtime, for providers to start.
import { vmRuntimeFile } from "../source-dir.ts";

/** `sandbox` is the example image; `probe` and `hog` exist for tests of the sandboxing. */
export const builtinImages = {
  sandbox: vmRuntimeFile("images/sandbox.ts"),
  probe: vmRuntimeFile("images/probe.ts"),
  hog: vmRuntimeFile("images/hog.ts"),
} as const;

// Absolute module paths of the images shipped with the runtime, for providers to start.
import { vmRuntimeFile } from "../host/source-dir.ts";

/** `sandbox` is the example image (test images live in test/images/, never served). */
export const builtinImages = {
  sandbox: vmRuntimeFile("images/sandbox.ts"),
} as const;

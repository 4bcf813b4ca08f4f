// Module paths of the test-only images: a provider starts them by path; no host serves them.
import { fileURLToPath } from "node:url";

const here = (file: string) => fileURLToPath(new URL(file, import.meta.url));

export const testImages = {
  probe: here("./probe.ts"),
  hog: here("./hog.ts"),
  hostile: here("./hostile.ts"),
  counter: here("./counter.ts"),
  entropy: here("./entropy.ts"),
  heavyInit: here("./heavy-init.ts"),
  objectCounter: here("./object-counter.ts"),
  objectHostile: here("./object-hostile.ts"),
} as const;

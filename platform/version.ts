// The package's name and version, for `--version` of every command.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** `typed-task-service 0.1.0`: package.json of the checkout (this module sits one level below it, as `dist/main.mjs` does). */
export function packageVersion(): string {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { name: string; version: string };
  return `${pkg.name} ${pkg.version}`;
}

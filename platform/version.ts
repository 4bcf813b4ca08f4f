// The package's name and version, for `--version` of every command.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * `typed-task-service 0.1.0`: package.json of the checkout (this module sits one level below it, as `dist/main.mjs`
 * does).
 */
export function packageVersion(): string {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { name: string; version: string };
  return `${pkg.name} ${pkg.version}`;
}

/** The oldest Node.js line still maintained (April 2027); older lines are past their end of life. */
export const OLDEST_MAINTAINED_NODE = 22;

/**
 * What the service says when it runs on a Node.js line past its end of life (20 since April
 * 2026): it starts, but nothing tests it there. Undefined on a maintained line.
 */
export function unsupportedNode(version = process.versions.node): string | undefined {
  const major = Number(version.split(".")[0]);
  if (major >= OLDEST_MAINTAINED_NODE) return undefined;
  return `Node.js ${version} is past its end of life and not supported: use Node.js 26 (the active LTS) or 24`;
}

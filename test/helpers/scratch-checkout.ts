// A scratch copy of the checkout for code that writes where it runs (the docs' snippets): every
// file git would not ignore is copied, so a write lands in the copy, and what a user keeps in
// the checkout under an ignored name (`api-keys`, `*.key`, `.data/`) is neither read nor written.
import { cp, mkdtemp, readFile, stat, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join, relative } from "node:path";

/** Ignored entries the copy links instead, read as installed or built: dependencies, tools, the build. */
export const LINKED = ["node_modules", ".tools", "dist"] as const;

/**
 * A test of a path relative to the root against the root `.gitignore`: the forms it uses (names, `*`, a trailing `/`, a
 * `/` inside).
 */
export function gitignored(gitignore: string): (path: string, isDirectory: boolean) => boolean {
  const rules = gitignore
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"))
    .map((pattern) => {
      // Read wrongly, a form would let the copy take a secret or lose a source file.
      if (/^!|\*\*|[[?\\]/.test(pattern))
        throw new Error(`.gitignore: "${pattern}" is a form the scratch copy cannot read`);
      const body = pattern.replace(/^\/|\/$/g, "");
      const glob = body
        .split("*")
        .map((part) => part.replace(/[.+^${}()|]/g, "\\$&"))
        .join("[^/]*");
      return { re: new RegExp(`^${glob}$`), directoryOnly: pattern.endsWith("/"), fromRoot: body.includes("/") };
    });
  return (path, isDirectory) =>
    rules.some((rule) => (isDirectory || !rule.directoryOnly) && rule.re.test(rule.fromRoot ? path : basename(path)));
}

/** Copies `root` into a new temporary directory (removing it is the caller's), linking {@link LINKED}. */
export async function scratchCheckout(root: string): Promise<string> {
  const work = await mkdtemp(join(tmpdir(), "docs-"));
  const ignored = gitignored(await readFile(join(root, ".gitignore"), "utf8").catch(() => ""));
  await cp(root, work, {
    recursive: true,
    verbatimSymlinks: true,
    filter: async (source) => {
      const path = relative(root, source);
      if (path === "") return true;
      return path !== ".git" && !ignored(path, (await stat(source).catch(() => undefined))?.isDirectory() ?? false);
    },
  });
  for (const entry of LINKED) {
    const present = await stat(join(root, entry)).catch(() => undefined);
    if (present) await symlink(join(root, entry), join(work, entry));
  }
  return work;
}

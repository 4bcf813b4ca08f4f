// Files planted in a directory under the names a user may keep there, to show that a test leaves
// them as they were. A name already taken is the user's: it is only read, compared and left.
import { randomUUID } from "node:crypto";
import { lstat, readFile, rm, writeFile } from "node:fs/promises";
import { dirname, extname, join } from "node:path";

const MARK = "planted by test/docs.test.ts to check that npm test leaves it unchanged; safe to delete";

export interface Planted {
  readonly name: string;
  /** What it held when planted or found. */
  readonly content: Buffer;
  /** Planted here (and removed by `remove`), not found. */
  readonly ours: boolean;
}

/** A file's text in the syntax its name implies, so that it is a valid file of its kind. */
function plantedText(name: string): string {
  const line = `${MARK} (${randomUUID()})`;
  if ([".ts", ".mjs", ".js"].includes(extname(name))) return `// ${line}\n`;
  if (extname(name) === ".json") return `${JSON.stringify({ planted: line })}\n`;
  return `# ${line}\n`;
}

/** Plants each of `names` under `dir` where it is free (a planted file a killed run left counts as free). */
export async function plantFiles(dir: string, names: readonly string[]): Promise<Planted[]> {
  const planted: Planted[] = [];
  for (const name of names) {
    const path = join(dir, name);
    const found = await lstat(path).catch(() => undefined);
    if (found && !found.isFile()) continue;
    const content = found ? await readFile(path) : undefined;
    if (content && !content.includes(MARK)) {
      planted.push({ name, content, ours: false });
      continue;
    }
    if (!(await lstat(dirname(path)).catch(() => undefined))?.isDirectory()) continue;
    const text = Buffer.from(plantedText(name));
    await writeFile(path, text, { flag: content ? "w" : "wx" });
    planted.push({ name, content: text, ours: true });
  }
  return planted;
}

/** The planted or found files under `dir` that no longer hold what they held, and how. */
export async function changedFiles(dir: string, planted: readonly Planted[]): Promise<string[]> {
  const changed: string[] = [];
  for (const file of planted) {
    const now = await readFile(join(dir, file.name)).catch((err: NodeJS.ErrnoException) => err.code ?? "unreadable");
    if (typeof now === "string") changed.push(`${file.name}: ${now}`);
    else if (!now.equals(file.content))
      changed.push(`${file.name}: ${JSON.stringify(now.toString("utf8").slice(0, 200))}`);
  }
  return changed;
}

/** Removes the files planted here (never one that was found). */
export async function removePlanted(dir: string, planted: readonly Planted[]): Promise<void> {
  for (const file of planted) if (file.ours) await rm(join(dir, file.name), { force: true });
}

// The fenced code blocks of the docs as test/docs.test.ts runs them: their markers, the files
// they write, and the shell lines whose trailing comment shows the JSON they print.
import { fileURLToPath } from "node:url";

export interface Block {
  readonly file: string;
  /** The line of its opening fence. */
  readonly line: number;
  readonly lang: string;
  readonly code: string;
  readonly skip?: string;
  readonly writeTo?: string;
  readonly httpErrors?: boolean;
}

/** The fenced blocks of a markdown file, with the marker on the line before each. */
export function codeBlocks(file: string, markdown: string): Block[] {
  const lines = markdown.split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*$/.exec(lines[i]!);
    if (!open) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i]!); i++) body.push(lines[i]!);
    let marker = "";
    for (let j = start - 1; j >= 0 && marker === ""; j--) {
      if (lines[j]!.trim() === "") continue;
      marker = lines[j]!.trim();
      if (!marker.startsWith("<!--")) break;
    }
    const skip = /^<!-- not run: (.+) -->$/.exec(marker)?.[1];
    const writeTo = /^<!-- file: (\S+) -->$/.exec(marker)?.[1];
    const httpErrors = marker === "<!-- http errors expected -->";
    blocks.push({ file, line: start + 1, lang: open[1]!, code: `${body.join("\n")}\n`, skip, writeTo, httpErrors });
  }
  return blocks;
}

/** A shell line without its quoted strings and its comment: what is left of it that the shell reads as words. */
const shellWords = (line: string) =>
  line
    .replace(/'[^']*'|"[^"]*"/g, "''")
    .replace(/(^|\s)#.*$/, "")
    .trim();

/**
 * The relative paths a block writes where it runs: a `<!-- file: -->` block's name; in a shell
 * block, the targets of `>`, `>>`, `tee`, `-o`/`--output` and `--outfile`.
 */
export function writtenFiles(block: Block): string[] {
  if (block.writeTo) return [block.writeTo];
  if (block.lang !== "sh") return [];
  const targets: string[] = [];
  for (const line of block.code.split("\n").map(shellWords)) {
    const found = line.matchAll(
      /(?:(?:^|[^<>&=\d])\d?>>?|\btee(?:\s+-a)?|\s(?:-o|--output|--outfile)(?:\s+|=))\s*([\w.][\w./-]*)/g,
    );
    for (const [, target] of found) targets.push(target!);
  }
  return targets;
}

const shapeChecker = fileURLToPath(new URL("./json-shape.mjs", import.meta.url));

/**
 * A shell block whose commands followed by a comment that is JSON (`curl -s …/$ID   # {"id":"…",…}`)
 * pipe their output into a check that it is JSON of that shape (the same keys, the same types;
 * each array element shaped as the comment's first). `firstLine` numbers the block's first line.
 */
export function withShapeChecks(code: string, file: string, firstLine: number): string {
  return code
    .split("\n")
    .map((line, i) => {
      const comment = /^(.*\S)\s+#\s(.+)$/.exec(line);
      if (!comment || /^\s*(\w+=|export\s|#)/.test(line) || /[&|\\]\s*$/.test(comment[1]!)) return line;
      try {
        JSON.parse(comment[2]!);
      } catch {
        return line;
      }
      const sample = Buffer.from(comment[2]!).toString("base64");
      return `${comment[1]} | node ${JSON.stringify(shapeChecker)} ${sample} ${file}:${firstLine + i}`;
    })
    .join("\n");
}

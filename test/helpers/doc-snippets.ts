// The fenced code blocks of the docs as test/docs.test.ts runs them: their markers and the files
// they write.

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

// The tables of a markdown page, for tests that hold the docs' tables to what the code declares
// or registers.

export interface Table {
  /** The last heading above the table, without its `#`s. */
  readonly heading: string;
  readonly header: string[];
  /** Each row by its header's names. */
  readonly rows: Record<string, string>[];
}

/** The cells of a table row (`\|` is a pipe inside a cell). */
export function cells(line: string): string[] {
  const trimmed = line.trim();
  if (!trimmed.startsWith("|")) return [];
  return trimmed
    .slice(1, -1)
    .split(/(?<!\\)\|/)
    .map((cell) => cell.trim());
}

/** The first code span of a cell (`""` when it has none). */
export const code = (cell: string) => /`([^`]*)`/.exec(cell)?.[1] ?? "";

/** Every table of `markdown`: a header row, a delimiter row, then rows until a line that is not one. */
export function markdownTables(markdown: string): Table[] {
  const tables: Table[] = [];
  const lines = markdown.split("\n");
  let heading = "";
  for (let i = 0; i < lines.length; i++) {
    const title = /^#+\s+(.*)$/.exec(lines[i]!);
    if (title) heading = title[1]!.trim();
    const header = cells(lines[i]!);
    if (header.length === 0 || !/^\|[\s|:-]+\|$/.test(lines[i + 1]?.trim() ?? "")) continue;
    const rows: Record<string, string>[] = [];
    for (i += 2; i < lines.length && lines[i]!.trim().startsWith("|"); i++) {
      const values = cells(lines[i]!);
      rows.push(Object.fromEntries(header.map((name, k) => [name, values[k] ?? ""])));
    }
    i--; // the line after the table, read again by the loop (it may be a heading)
    tables.push({ heading, header, rows });
  }
  return tables;
}

// Writes a run's results as JSON: bench/results/<ISO timestamp>[-kind].json and latest[-kind].json.
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { root } from "./children.ts";

export const resultsDir = join(root, "bench", "results");

/** Returns the timestamped file's path. `kind` tells apart runs of another sort ("growth"). */
export async function writeResults(data: unknown, startedAt: Date, kind?: string): Promise<string> {
  await mkdir(resultsDir, { recursive: true });
  const suffix = kind ? `-${kind}` : "";
  // Colons are awkward in file names on some systems; keep the ISO shape otherwise.
  const stamp = startedAt.toISOString().replace(/:/g, "-");
  const file = join(resultsDir, `${stamp}${suffix}.json`);
  const text = `${JSON.stringify(data, null, 2)}\n`;
  await writeFile(file, text);
  await writeFile(join(resultsDir, `latest${suffix}.json`), text);
  return file;
}

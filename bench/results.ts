// Writes a run's results as JSON: bench/results/<ISO timestamp>[-kind].json and
// latest[-kind].json (the placement bench's: placement-<ISO timestamp>.json and placement-latest.json).
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { root } from "./children.ts";

export const resultsDir = join(root, "bench", "results");

/** Returns the timestamped file's path. `kind` tells apart runs of another sort ("growth"). */
export async function writeResults(data: unknown, startedAt: Date, kind?: string): Promise<string> {
  await mkdir(resultsDir, { recursive: true });
  // Colons are awkward in file names on some systems; keep the ISO shape otherwise.
  const stamp = startedAt.toISOString().replace(/:/g, "-");
  const [file, latest] =
    kind === "placement"
      ? [`placement-${stamp}.json`, "placement-latest.json"]
      : [`${stamp}${kind ? `-${kind}` : ""}.json`, `latest${kind ? `-${kind}` : ""}.json`];
  const text = `${JSON.stringify(data, null, 2)}\n`;
  await writeFile(join(resultsDir, file), text);
  await writeFile(join(resultsDir, latest), text);
  return join(resultsDir, file);
}

/** Writes the results and prints `results: <file>` (after a blank line unless `lead` says otherwise). */
export async function saveResults(data: unknown, startedAt: Date, kind?: string, lead = "\n"): Promise<void> {
  console.log(`${lead}results: ${await writeResults(data, startedAt, kind)}`);
}

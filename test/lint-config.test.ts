// Biome reads biome.jsonc without a word about the file itself: a deprecated or unknown field is
// a `deserialize` diagnostic, an info that `npm run lint` passes over, until the next major
// version of Biome refuses the file.
import { it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));

it("lint config - biome.jsonc has no deprecated or unknown field", async () => {
  // The JSON report (its format is Biome's, pinned with its exact version in package.json).
  const stdout = await new Promise<string>((resolve) =>
    execFile(
      join(root, "node_modules/.bin/biome"),
      ["ci", "--colors=off", "--reporter=json", "biome.jsonc"],
      { cwd: root },
      (_, out) => resolve(out),
    ),
  );
  const report = JSON.parse(stdout) as { diagnostics: { category: string; message: string }[] };
  const about = report.diagnostics.filter((d) => d.category === "deserialize").map((d) => d.message);
  assert.deepEqual(about, [], "what Biome says of biome.jsonc");
});

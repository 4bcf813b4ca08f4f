// A node:test reporter beside TAP: after the run, each failed test or hook with its error's
// first lines, so that the end of a long log says why a run failed (the TAP block of a failure
// can be thousands of lines above). Tests cancelled because their suite failed are counted, not
// repeated. Used by `npm test`, `npm run test:faults` and the container suite:
//   node --test --test-reporter=tap --test-reporter-destination=stdout \
//     --test-reporter=./test/helpers/failure-summary.mjs --test-reporter-destination=stdout …
const MAX_LINES = 25;

/** The error's message and its causes' (a failed hook's error is the cause of the test's). */
function describe(error) {
  const lines = [];
  for (let err = error, depth = 0; err && depth < 4; err = err.cause, depth++) {
    const text = typeof err === "object" && "message" in err ? String(err.message) : String(err);
    if (!lines.includes(text)) lines.push(text);
  }
  const all = lines.join("\n").split("\n");
  return all.length > MAX_LINES ? [...all.slice(0, MAX_LINES), `… (${all.length - MAX_LINES} more lines)`] : all;
}

export default async function* failureSummary(source) {
  const failures = [];
  let cancelled = 0;
  let todo = 0;
  for await (const event of source) {
    if (event.type !== "test:fail") continue;
    const { name, file, details } = event.data;
    // A todo test's failure is known and does not fail the run: counted, not listed.
    if (event.data.todo !== undefined && event.data.todo !== false) {
      todo++;
      continue;
    }
    if (details?.error?.failureType === "cancelledByParent") {
      cancelled++;
      continue;
    }
    failures.push({ name, file, lines: describe(details?.error) });
  }
  if (todo > 0) yield `\n# todo tests that failed (known, not failures of the run): ${todo}\n`;
  if (failures.length === 0 && cancelled === 0) return;
  let out =
    `\n# failures: ${failures.length}` + `${cancelled ? ` (and ${cancelled} tests cancelled with their suite)` : ""}\n`;
  for (const { name, file, lines } of failures) {
    out += `# ✖ ${name}${file ? ` (${file.replace(`${process.cwd()}/`, "")})` : ""}\n`;
    out += lines.map((line) => `#     ${line}\n`).join("");
  }
  yield out;
}

// The default run's microVM rows alone (after a run whose HTTP rows are wanted no more):
// `npx tsx bench/microvm-rows.ts [--quick]`.
import { runDefaultMicrovmRows } from "./microvm.ts";
import { parseOptions } from "./options.ts";

await runDefaultMicrovmRows(parseOptions(process.argv.slice(2)), { command: "bench/microvm-rows.ts" }, new Date());

// `npm run watch-jobs`: prints every job created from now on, one JSON line each (stdout); says
// on stderr which NATS it watches. Joins NATS_URL, else the private nats-server of `npm start`
// (`.data/nats-url`), as the `internal` user of that server unless NATS_CREDS, NATS_USER or
// NATS_NKEY say otherwise.
import { parseArgs } from "node:util";
import { connectToService, serviceNats } from "./connect.ts";
import { watchJobs } from "./watch.ts";

const usage = `usage: npm run watch-jobs [-- --from-start]

Prints every job created from now on as a JSON line {"id","content","revision"}; Ctrl-C stops.

  --from-start  print the stored jobs first
  --help        this text
  --version     the version

env: NATS_URL (default: the NATS of a local npm start, from DATA_DIR/nats-url), DATA_DIR,
NATS_CREDS, NATS_USER/NATS_PASSWORD, NATS_NKEY.`;

function fail(message: string, code: number): never {
  console.error(`error: ${message}`);
  process.exit(code);
}

const flags = (() => {
  try {
    return parseArgs({
      options: {
        "from-start": { type: "boolean" },
        help: { type: "boolean", short: "h" },
        version: { type: "boolean", short: "v" },
      },
    }).values;
  } catch (err) {
    return fail(`${(err as Error).message} (npm run watch-jobs -- --help)`, 2);
  }
})();
if (flags.help) {
  console.log(usage);
  process.exit(0);
}
if (flags.version) {
  console.log((await import("../platform/index.ts")).packageVersion());
  process.exit(0);
}

const { servers, from } = await serviceNats().catch((err: Error) => fail(err.message, 1));
const nc = await connectToService({ name: "watch-jobs" }).catch((err: Error) => fail(err.message, 1));
process.on("SIGINT", () => void nc.close().then(() => process.exit(0)));
const onWatching = () =>
  console.error(
    `watching jobs created on ${servers} (${from})${flags["from-start"] ? ", stored ones first" : ""}; Ctrl-C to stop`,
  );
try {
  const prefix = process.env.NATS_SUBJECT_PREFIX ?? "";
  for await (const job of watchJobs(nc, { fromStart: flags["from-start"] === true, onWatching, prefix }))
    console.log(JSON.stringify(job));
} catch (err) {
  const message = (err as Error).message;
  const hint = /stream not found/.test(message)
    ? ": no jobs bucket there yet (the service creates it when it starts)"
    : `: ${message}`;
  fail(`cannot watch jobs on ${servers}${hint}`, 1);
}

// `npm run watch-jobs`: prints every job created from now on, one JSON line each.
// Joins NATS_URL, else the private nats-server of `npm start` (`.data/nats-url`).
import { readFile } from "node:fs/promises";
import { connect } from "@nats-io/transport-node";
import { watchJobs } from "./watch.ts";

const servers = process.env.NATS_URL || (await readFile(".data/nats-url", "utf8").catch(() => "")).trim();
if (!servers) {
  console.error("error: set NATS_URL or start the service with `npm start` first");
  process.exit(1);
}
const nc = await connect({ servers: servers.split(",") });
process.on("SIGINT", () => void nc.close().then(() => process.exit(0)));
for await (const job of watchJobs(nc, { fromStart: process.argv.includes("--from-start") })) {
  console.log(JSON.stringify(job));
}

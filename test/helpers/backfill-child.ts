// A process that runs the list-index backfill against `NATS_URL` and exits: the backfill test
// kills it halfway (SIGKILL) and runs it again.
import { backfillIndexes } from "../../actors/index.ts";
import { connectNats } from "../../platform/index.ts";

const nats = await connectNats({ servers: process.env.NATS_URL!, name: "backfill-child" });
process.stdout.write("started\n");
await backfillIndexes(nats.requester);
await nats.close();

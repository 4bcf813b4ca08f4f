// How long the names of a frozen (SIGSTOPped) task-object owner go unanswered: the cluster of
// the fault tests under steady task-object load, the busiest owner paused until each of its
// names is activated elsewhere, resumed, and again, PAUSES times (default 5). Prints, per pause,
// the longest time a name went without a 200 and when the last name was activated elsewhere,
// then the medians. Run it beside a CPU hog to see the bound the fault test may state:
//   npm run bench:takeover                      # PAUSES=5
//   node -e 'for(;;){}' & npm run bench:takeover; kill $!
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startCluster } from "../cluster/index.ts";
import { activationIntervals } from "../test/helpers/activations.ts";
import { activationLog, activationLogEnv, faultTopology } from "../test/helpers/fault-cluster.ts";
import { longestOutage, startObjectLoad } from "../test/helpers/object-load.ts";
import { median, pause as sleep } from "./stats.ts";

const PAUSES = Number(process.env.PAUSES ?? 5);

const baseDir = await mkdtemp(join(tmpdir(), "takeover-bench-"));
const log = activationLog();
const cluster = await startCluster(faultTopology, { baseDir, onLine: log.onLine, env: activationLogEnv });
const urls = cluster.gateways.map((g) => `http://127.0.0.1:${g.ports!.task}`);
const names = Array.from({ length: 20 }, (_, i) => `object-${i + 1}`);
const load = startObjectLoad(names, urls);
const outages: number[] = [];
const takeovers: number[] = [];
try {
  await sleep(3_000);
  for (let i = 0; i < PAUSES; i++) {
    const open = activationIntervals(log.events).filter((a) => a.end === undefined);
    const counts = new Map<string, number>();
    for (const a of open) counts.set(a.owner, (counts.get(a.owner) ?? 0) + 1);
    const [owner, held] = [...counts].sort((a, b) => b[1] - a[1])[0]!;
    const paused = cluster.services.find((s) => s.name === log.processOf.get(owner))!;
    const pausedNames = open.filter((a) => a.owner === owner).map((a) => a.name);
    const stoppedAt = Date.now();
    process.kill(paused.pid, "SIGSTOP");
    const startedElsewhere = (name: string) =>
      log.events.find((e) => e.name === name && e.event === "start" && e.owner !== owner && e.at > stoppedAt)?.at;
    try {
      while (!pausedNames.every(startedElsewhere) && Date.now() - stoppedAt < 30_000) await sleep(50);
    } finally {
      process.kill(paused.pid, "SIGCONT");
    }
    const takeoverMs = Math.max(...pausedNames.map((n) => (startedElsewhere(n) ?? Infinity) - stoppedAt));
    await sleep(5_000);
    const outage = longestOutage(load.attempts, names, stoppedAt, Date.now());
    outages.push(outage?.ms ?? Infinity);
    takeovers.push(takeoverMs);
    console.log(
      `pause ${i + 1}: ${paused.name} held ${held} names; all activated elsewhere after ${takeoverMs} ms; longest ` +
        `time a name went without a 200: ${outage?.ms} ms (${outage?.name})`,
    );
  }
  console.log(
    `median of ${PAUSES}: takeover ${median(takeovers)} ms, longest time without a 200 ${median(outages)} ms (max ` +
      `${Math.max(...outages)} ms)`,
  );
} finally {
  await load.stop();
  await cluster.stop();
  await rm(baseDir, { recursive: true, force: true });
}

// A paused NATS (SIGSTOP for 3 s, as a stalled disk or a frozen VM looks from outside) under
// steady createTask/createJob load: every request answers within its timeout (503/504 while
// NATS cannot answer), the gateway's memory stays bounded, the service recovers after
// SIGCONT without a restart, and no acknowledged write is lost.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { lifo } from "../helpers/defer.ts";
import { firstOkAfter, lostCreates, startLoad, statusCounts } from "../helpers/load.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";

const PAUSE_MS = 3_000;
// Shorter than the pause, so requests caught by it must be answered 504 (or 503), not wait it out.
const REQUEST_TIMEOUT_MS = 1_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function rssMiB(pid: number): number {
  const kib = Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? NaN);
  return Math.round(kib / 1024);
}

/** The state letter of `pid` in /proc (T: stopped), after the command name, which may hold spaces. */
function processState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
}

/** Waits until `pid` is in `state`; a pause that has not taken hold within PAUSE_MS tested nothing. */
async function untilState(pid: number, state: string): Promise<void> {
  for (const since = Date.now(); processState(pid) !== state; await sleep(5)) {
    assert.ok(Date.now() - since < PAUSE_MS, `pid ${pid} in state ${processState(pid)}, not ${state}`);
  }
}

describe("faults: nats paused", () => {
  it("nats paused - SIGSTOP for 3 s under load: answers within the timeout, bounded memory, recovery, nothing lost", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    const natsPid = nats.server!.pid;
    defer(() => void process.kill(natsPid, "SIGCONT")); // never leave it stopped
    const svc = await startServiceProcess({ ...nats.env(), REQUEST_TIMEOUT_MS: String(REQUEST_TIMEOUT_MS) }, [
      "--role",
      "gateway,actors",
    ]);
    defer(() => svc.stop("SIGKILL"));
    const gatewayPid = svc.child.pid!;

    const load = startLoad(
      [
        { url: `${svc.taskUrl}/`, body: () => ({ title: "paused" }), idOf: (a) => (a as { id: string }).id },
        { url: `${svc.jobUrl}/`, body: () => ({ content: "paused" }), idOf: (a) => a as string },
      ],
      16,
    );
    const rss: { at: number; mib: number }[] = [];
    const sampler = setInterval(() => rss.push({ at: Date.now(), mib: rssMiB(gatewayPid) }), 100);
    let stopped = 0;
    let resumed = 0;
    let recovered = 0;
    try {
      await sleep(2_000);
      process.kill(natsPid, "SIGSTOP");
      stopped = Date.now();
      await untilState(natsPid, "T"); // the pause hit: nats-server is stopped, not just signalled
      await sleep(PAUSE_MS);
      process.kill(natsPid, "SIGCONT");
      resumed = Date.now();
      recovered = await firstOkAfter(load, resumed, 15_000, "recovery after SIGCONT");
      await sleep(3_000);
    } finally {
      clearInterval(sampler);
      await load.stop();
    }

    const answers = load.answers;
    const ok = answers.filter((a) => a.status === 200);
    const statuses = statusCounts(answers);
    // Requests in flight at the pause or sent during it.
    const affected = answers.filter((a) => a.at + a.ms >= stopped && a.at < resumed);
    const slowest = Math.max(0, ...affected.map((a) => a.ms));
    const rssBefore = Math.max(...rss.filter((s) => s.at < stopped).map((s) => s.mib));
    const rssPeak = Math.max(...rss.map((s) => s.mib));
    const rssAfter = rss.at(-1)!.mib;

    const lost = await lostCreates(answers, svc);
    const report = {
      pauseMs: PAUSE_MS,
      requests: answers.length,
      acknowledged: ok.length,
      lost,
      statuses,
      affected: affected.length,
      affectedStatuses: statusCounts(affected),
      slowestAffectedMs: slowest,
      recoveryAfterSigcontMs: recovered - resumed,
      gatewayRssMiB: { before: rssBefore, peak: rssPeak, after: rssAfter },
    };
    console.log(`# nats paused: ${JSON.stringify(report)}`);
    assert.equal(lost, 0, "every acknowledged create is readable");
    assert.ok(affected.length > 0, "requests were in flight during the pause");
    assert.equal(statuses["0"], undefined, "no request went unanswered (the client gives up after 10 s)");
    assert.equal(statuses["500"], undefined, "no 500s");
    assert.ok(
      affected.some((a) => a.status === 503 || a.status === 504),
      "requests caught by the pause were answered 503/504",
    );
    assert.ok(
      affected.every((a) => [200, 503, 504].includes(a.status)),
      `answers during the pause are 200, 503 or 504: ${JSON.stringify(report.affectedStatuses)}`,
    );
    // The actor timeout plus slack for a loaded 2-core machine.
    assert.ok(slowest <= REQUEST_TIMEOUT_MS + 2_000, `every answer within the timeout (slowest ${slowest} ms)`);
    assert.ok(rssPeak <= rssBefore + 100, `gateway RSS bounded (${rssBefore} MiB before, ${rssPeak} MiB peak)`);
  });
});

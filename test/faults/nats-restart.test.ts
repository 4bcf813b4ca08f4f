// NATS killed with SIGKILL and restarted on the same port and store, again and again, under
// steady createTask/createJob load: no acknowledged write lost, fast 503s during outages,
// recovery without restarting the service. RESTARTS sets the count (default 10).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { lifo } from "../helpers/defer.ts";
import { startLoad } from "../helpers/load.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";
import { getJson } from "../helpers/service.ts";
import { startNatsServer, type NatsServer } from "../../platform/index.ts";

const RESTARTS = Number(process.env.RESTARTS ?? 10);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("faults: nats restarts", () => {
  it(`nats restarts - ${RESTARTS} kill -9 restarts under load lose no acknowledged write`, async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    let server: NatsServer = nats.server!;
    defer(() => server.stop());
    const svc = await startServiceProcess({ NATS_URL: nats.url }, ["--role", "gateway,actors"]);
    defer(() => svc.stop("SIGKILL"));

    const load = startLoad(
      [
        { url: `${svc.taskUrl}/`, body: () => ({ title: "fault" }), idOf: (a) => (a as { id: string }).id },
        { url: `${svc.jobUrl}/`, body: () => ({ content: "fault" }), idOf: (a) => a as string },
      ],
      16,
    );
    const outages: { down: number; up: number; recovered: number }[] = [];
    try {
      await sleep(1_000);
      for (let i = 0; i < RESTARTS; i++) {
        server.process.kill("SIGKILL");
        await new Promise((r) => server.process.once("exit", r));
        const down = Date.now();
        await sleep(700);
        server = await startNatsServer({ storeDir: nats.storeDir!, port: server.port });
        const up = Date.now();
        while (!load.answers.some((a) => a.at >= up && a.status === 200)) {
          assert.ok(Date.now() - up < 15_000, "service recovered within 15 s");
          await sleep(20);
        }
        const recovered = Math.min(...load.answers.filter((a) => a.at >= up && a.status === 200).map((a) => a.at + a.ms));
        outages.push({ down, up, recovered });
        await sleep(1_000);
      }
    } finally {
      await load.stop();
    }

    const answers = load.answers;
    const ok = answers.filter((a) => a.status === 200);
    const statuses = Object.fromEntries([...new Set(answers.map((a) => a.status))].map((s) => [s, answers.filter((a) => a.status === s).length]));
    // Answers to requests sent while NATS was down: fast 503s with Retry-After.
    const duringOutage = answers.filter((a) => outages.some((o) => a.at >= o.down + 50 && a.at < o.up));
    const maxOutageMs = Math.max(0, ...duringOutage.map((a) => a.ms));
    const recoveryMs = outages.map((o) => o.recovered - o.up);

    let lost = 0;
    for (const answer of ok) {
      const url = answer.target === 0 ? `${svc.taskUrl}/${answer.id}` : `${svc.jobUrl}/?jobId=${answer.id}`;
      if ((await getJson(url)).status !== 200) lost++;
    }
    const report = {
      restarts: RESTARTS,
      requests: answers.length,
      acknowledged: ok.length,
      lost,
      statuses,
      outageAnswers: duringOutage.length,
      maxOutageResponseMs: maxOutageMs,
      maxRecoveryMs: Math.max(...recoveryMs),
      medianRecoveryMs: recoveryMs.sort((a, b) => a - b)[Math.floor(recoveryMs.length / 2)],
    };
    console.log(`# nats restarts: ${JSON.stringify(report)}`);
    assert.equal(lost, 0, "every acknowledged create is readable");
    assert.ok(ok.length > 100, "the load made progress");
    assert.ok(duringOutage.length > 0, "requests were sent during outages");
    assert.ok(duringOutage.every((a) => a.status === 503 && a.retryAfter === "1"), `outage answers are 503: ${JSON.stringify(statuses)}`);
    assert.ok(maxOutageMs <= 1_000, `outage answers within 1 s (max ${maxOutageMs} ms)`);
    assert.ok(report.maxRecoveryMs <= 2_000, `recovery within 2 s (max ${report.maxRecoveryMs} ms)`);
    assert.equal(statuses["500"], undefined, "no 500s");
  });
});

// NATS killed with SIGKILL and restarted on the same port and store, again and again, under
// steady createTask/createJob load: no acknowledged write lost, fast 503s during outages,
// recovery without restarting the service. RESTARTS sets the count (default 10).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { lifo } from "../helpers/defer.ts";
import { firstOkAfter, lostCreates, startLoad, statusCounts } from "../helpers/load.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";
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
    const svc = await startServiceProcess(nats.env(), ["--role", "gateway,actors"]);
    defer(() => svc.stop("SIGKILL"));

    const load = startLoad(
      [
        { url: `${svc.taskUrl}/`, body: () => ({ title: "fault" }), idOf: (a) => (a as { id: string }).id },
        { url: `${svc.jobUrl}/`, body: () => ({ content: "fault" }), idOf: (a) => a as string },
      ],
      16,
    );
    // `restarting`: when the new server was launched. Requests sent before it met no server at all;
    // those sent between it and `up` (the ready line, read late on a busy machine) may be served.
    const outages: { down: number; restarting: number; up: number; recovered: number }[] = [];
    try {
      await sleep(1_000);
      for (let i = 0; i < RESTARTS; i++) {
        server.process.kill("SIGKILL");
        await new Promise((r) => server.process.once("exit", r));
        const down = Date.now();
        await sleep(700);
        const restarting = Date.now();
        server = await startNatsServer({
          storeDir: nats.storeDir!,
          port: server.port,
          authorization: nats.authorization,
        });
        const up = Date.now();
        const recovered = await firstOkAfter(load, up, 15_000, "recovery after the restart");
        outages.push({ down, restarting, up, recovered });
        await sleep(1_000);
      }
    } finally {
      await load.stop();
    }

    const answers = load.answers;
    const ok = answers.filter((a) => a.status === 200);
    const statuses = statusCounts(answers);
    // Answers to requests sent while NATS was down: fast 503s with Retry-After.
    const duringOutage = answers.filter((a) => outages.some((o) => a.at >= o.down + 50 && a.at < o.restarting));
    const maxOutageMs = Math.max(0, ...duringOutage.map((a) => a.ms));
    const recoveryMs = outages.map((o) => o.recovered - o.up);

    const lost = await lostCreates(answers, svc);
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
    assert.ok(
      duringOutage.every((a) => a.status === 503 && a.retryAfter === "1"),
      `outage answers are 503: ${JSON.stringify(statuses)}`,
    );
    assert.ok(maxOutageMs <= 1_000, `outage answers within 1 s (max ${maxOutageMs} ms)`);
    assert.ok(report.maxRecoveryMs <= 2_000, `recovery within 2 s (max ${report.maxRecoveryMs} ms)`);
    assert.equal(statuses["500"], undefined, "no 500s");
  });
});

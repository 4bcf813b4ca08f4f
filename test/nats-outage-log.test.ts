// A service process says when it loses NATS and when NATS is back: one line each per outage,
// though it holds one connection per role.
import { it } from "node:test";
import assert from "node:assert/strict";
import { startNatsServer } from "../platform/index.ts";
import { lifo } from "./helpers/defer.ts";
import { skipUnlessRestartable, testNats } from "./helpers/nats.ts";
import { startServiceProcess } from "./helpers/process.ts";
import { postJson } from "./helpers/service.ts";

/** Resolves once `logs` holds a line with `msg`; rejects after `ms` (generous: the machine is busy). */
async function logged(logs: Record<string, unknown>[], msg: string, ms = 30_000): Promise<Record<string, unknown>> {
  for (const end = Date.now() + ms; Date.now() < end; await new Promise((r) => setTimeout(r, 50))) {
    const line = logs.find((l) => l.msg === msg);
    if (line) return line;
  }
  throw new Error(`no "${msg}" line in ${ms} ms: ${JSON.stringify(logs.map((l) => l.msg))}`);
}

const LOST = "lost the NATS connection: requests answer 503 until it is back; reconnecting";
const BACK = "NATS connection back";

it("nats outage log - losing NATS is one warning, getting it back one info line", async (t) => {
  if (await skipUnlessRestartable(t)) return;
  const defer = lifo((fn) => t.after(fn));
  const nats = await testNats(defer, { private: true });
  const service = await startServiceProcess(nats.env(), ["--role", "gateway,actors"]);
  defer(() => service.stop("SIGKILL"));
  assert.equal(service.logs.filter((l) => l.msg === LOST || l.msg === BACK).length, 0, "nothing before an outage");

  await nats.server!.stop();
  const lost = await logged(service.logs, LOST);
  assert.equal(lost.level, 40, "a warning");
  assert.equal(lost.nats, nats.url);

  const restarted = await startNatsServer({
    storeDir: nats.storeDir!,
    port: nats.server!.port,
    authorization: nats.authorization,
  });
  defer(() => restarted.stop());
  const back = await logged(service.logs, BACK);
  assert.equal(back.level, 30, "info");
  assert.ok(service.logs.indexOf(back) > service.logs.indexOf(lost));
  // The service answers again (JetStream may take a moment after the server is up).
  let status = 0;
  for (
    const end = Date.now() + 30_000;
    status !== 200 && Date.now() < end;
    await new Promise((r) => setTimeout(r, 100))
  ) {
    status = (await postJson(`${service.taskUrl}/`, { title: "after the outage" })).status;
  }
  assert.equal(status, 200);
  assert.equal(service.logs.filter((l) => l.msg === LOST).length, 1, "one warning for the outage");
  assert.equal(service.logs.filter((l) => l.msg === BACK).length, 1, "one recovery line");

  assert.equal(await service.stop(), 0);
  assert.equal(service.logs.filter((l) => l.msg === LOST).length, 1, "an own shutdown is not a loss");
});

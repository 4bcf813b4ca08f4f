// Two actor processes share the queue groups; one is killed with SIGKILL under load. No
// acknowledged write is lost. Task and job errors stop at once: requests that were in flight
// on the killed process are retried on the other (same idempotency key, so never written
// twice). The task object may have lived in the killed process: it moves to the other one
// once its lease lapses (README, placement), so its errors stop within the failover bound.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { lifo } from "../helpers/defer.ts";
import { startLoad } from "../helpers/load.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess } from "../helpers/process.ts";
import { getJson } from "../helpers/service.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A task object whose owner was killed moves after its lease lapses (2 s + 0.5 s margin). */
const FAILOVER_BOUND_MS = 5_000;

describe("faults: actor kill", () => {
  it("actor kill - SIGKILL of one of two actor processes loses no acknowledged write", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    const env = nats.env();
    const actorA = await startServiceProcess(env, ["--role", "actors"]);
    defer(() => actorA.stop("SIGKILL"));
    const actorB = await startServiceProcess(env, ["--role", "actors"]);
    defer(() => actorB.stop("SIGKILL"));
    const gateway = await startServiceProcess(env, ["--role", "gateway"]);
    defer(() => gateway.stop("SIGKILL"));

    const load = startLoad(
      [
        { url: `${gateway.taskUrl}/`, body: () => ({ title: "k" }), idOf: (a) => (a as { id: string }).id },
        { url: `${gateway.jobUrl}/`, body: () => ({ content: "k" }), idOf: (a) => a as string },
        { url: `${gateway.taskUrl}/do?name=kill`, body: () => ({ title: "k" }), idOf: (a) => (a as { id: string }).id },
      ],
      24,
    );
    let killedAt = 0;
    try {
      await sleep(1_500);
      killedAt = Date.now();
      await actorA.stop("SIGKILL");
      await sleep(7_000);
    } finally {
      await load.stop();
    }
    const answers = load.answers;
    const errors = answers.filter((a) => a.status !== 200);
    const TASK_OBJECT = 2; // the target index of `/do?name=kill`
    const lateErrors = errors.filter((a) =>
      a.target === TASK_OBJECT ? a.at > killedAt + FAILOVER_BOUND_MS : a.at > killedAt + 1_000,
    );
    let lost = 0;
    const urls = [
      (id: string) => `${gateway.taskUrl}/${id}`,
      (id: string) => `${gateway.jobUrl}/?jobId=${id}`,
      (id: string) => `${gateway.taskUrl}/do/${id}?name=kill`,
    ];
    const ok = answers.filter((a) => a.status === 200);
    for (const a of ok) if ((await getJson(urls[a.target]!(a.id!))).status !== 200) lost++;
    const afterKill = ok.filter((a) => a.at > killedAt).length;
    const objectAfterKill = ok.filter((a) => a.target === TASK_OBJECT && a.at > killedAt + FAILOVER_BOUND_MS).length;
    const objectErrors = errors.filter((a) => a.target === TASK_OBJECT).map((a) => a.at - killedAt);
    const objectFailover = objectErrors.length > 0 ? Math.max(...objectErrors) : 0;
    console.log(
      `# actor kill: ${JSON.stringify({ requests: answers.length, acknowledged: ok.length, afterKill, errors: errors.length, lateErrors: lateErrors.length, lost, lastTaskObjectErrorMs: objectFailover })}`,
    );
    assert.equal(lost, 0);
    assert.ok(afterKill > 50, "the surviving actor kept serving");
    assert.equal(
      lateErrors.length,
      0,
      "no task or job errors a second after the kill, no task-object errors after the failover bound",
    );
    assert.ok(objectAfterKill > 10, "the task object answered again after the failover");
  });
});

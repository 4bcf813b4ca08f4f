// Two actor processes share the queue groups; the one holding the task object is killed with
// SIGKILL under load. No acknowledged write is lost. Task and job errors stop at once: requests
// that were in flight on the killed process are retried on the other (same idempotency key, so
// never written twice). The task object moves to the other process once its lease lapses
// (README, placement), so its errors stop within the failover bound.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import type { ActivationEvent } from "../../actors/index.ts";
import { FAILOVER_BOUND_MS } from "../helpers/fault-bounds.ts";
import { lifo } from "../helpers/defer.ts";
import { startLoad } from "../helpers/load.ts";
import { skipUnlessRestartable, testNats } from "../helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "../helpers/process.ts";
import { getJson } from "../helpers/service.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const OBJECT = "kill";

/** The activations of the task object a process logged (debug lines). */
const activationsIn = (p: ServiceProcess) =>
  p.logs.flatMap((l) => {
    const event = l.activation as ActivationEvent | undefined;
    return event?.name === OBJECT ? [event] : [];
  });

describe("faults: actor kill", () => {
  it("actor kill - SIGKILL of one of two actor processes loses no acknowledged write", async (t) => {
    const defer = lifo((fn) => t.after(fn));
    if (await skipUnlessRestartable(t)) return;
    const nats = await testNats(defer, { private: true });
    const env = nats.env();
    // Debug level: each process logs the activations it starts and ends.
    const actors = [
      await startServiceProcess({ ...env, LOG_LEVEL: "debug" }, ["--role", "actors"]),
      await startServiceProcess({ ...env, LOG_LEVEL: "debug" }, ["--role", "actors"]),
    ];
    for (const actor of actors) defer(() => actor.stop("SIGKILL"));
    const gateway = await startServiceProcess(env, ["--role", "gateway"]);
    defer(() => gateway.stop("SIGKILL"));

    const load = startLoad(
      [
        { url: `${gateway.taskUrl}/`, body: () => ({ title: "k" }), idOf: (a) => (a as { id: string }).id },
        { url: `${gateway.jobUrl}/`, body: () => ({ content: "k" }), idOf: (a) => a as string },
        {
          url: `${gateway.taskUrl}/do?name=${OBJECT}`,
          body: () => ({ title: "k" }),
          idOf: (a) => (a as { id: string }).id,
        },
      ],
      24,
    );
    let killedAt = 0;
    let owner: ServiceProcess | undefined;
    try {
      await sleep(1_500);
      // The process holding the task object is the one killed, so its failover is always tested.
      const holder = () => actors.find((p) => activationsIn(p).some((e) => e.event === "start"));
      for (const since = Date.now(); !(owner = holder()); await sleep(20))
        assert.ok(Date.now() - since < 10_000, "no actor process logged the task object's activation");
      killedAt = Date.now();
      await owner.stop("SIGKILL");
      // The load goes on 2 s past the failover bound: the task object must answer again then.
      await sleep(FAILOVER_BOUND_MS + 2_000);
    } finally {
      await load.stop();
    }
    const survivor = actors.find((p) => p !== owner)!;
    const takenOver = activationsIn(survivor).find((e) => e.event === "start" && e.at > killedAt);
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
      (id: string) => `${gateway.taskUrl}/do/${id}?name=${OBJECT}`,
    ];
    const ok = answers.filter((a) => a.status === 200);
    for (const a of ok) if ((await getJson(urls[a.target]!(a.id!))).status !== 200) lost++;
    const afterKill = ok.filter((a) => a.at > killedAt).length;
    const objectAfterKill = ok.filter((a) => a.target === TASK_OBJECT && a.at > killedAt + FAILOVER_BOUND_MS).length;
    const objectErrors = errors.filter((a) => a.target === TASK_OBJECT).map((a) => a.at - killedAt);
    const objectFailover = objectErrors.length > 0 ? Math.max(...objectErrors) : 0;
    console.log(
      `# actor kill: ` +
        JSON.stringify({
          requests: answers.length,
          acknowledged: ok.length,
          afterKill,
          errors: errors.length,
          lateErrors: lateErrors.length,
          lost,
          lastTaskObjectErrorMs: objectFailover,
          takenOverMs: takenOver && takenOver.at - killedAt,
        }),
    );
    assert.equal(lost, 0);
    assert.ok(takenOver, "the surviving process activated the killed owner's task object");
    assert.ok(afterKill > 50, "the surviving actor kept serving");
    assert.equal(
      lateErrors.length,
      0,
      "no task or job errors a second after the kill, no task-object errors after the failover bound",
    );
    assert.ok(objectAfterKill > 10, "the task object answered again after the failover");
  });
});

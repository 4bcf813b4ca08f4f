// The typed clients, over HTTP and over NATS, against a running service.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { ClientError, httpClient, natsClient } from "../client/index.ts";
import { jobApi, taskApi } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

describe("client", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer);
  });

  const transports = () => ({
    http: { tasks: httpClient(taskApi, svc.taskUrl), jobs: httpClient(jobApi, svc.jobUrl) },
    nats: { tasks: natsClient(taskApi, svc.handle.nc), jobs: natsClient(jobApi, svc.handle.nc) },
  });

  for (const transport of ["http", "nats"] as const) {
    it(`client - ${transport}: tasks and task objects round trip`, async () => {
      const { tasks } = transports()[transport];
      const task = await tasks.createTask({ title: `via ${transport}` });
      assert.equal(task.title, `via ${transport}`);
      assert.deepEqual(await tasks.getTask({ id: task.id }), task);
      const inObject = await tasks.createTaskDO({ title: "do", name: `obj-${transport}` });
      assert.deepEqual(await tasks.getTaskDO({ id: inObject.id, name: `obj-${transport}` }), inObject);
      const inDefault = await tasks.createTaskDO({ title: "default" });
      assert.deepEqual(await tasks.getTaskDO({ id: inDefault.id }), inDefault);
    });

    it(`client - ${transport}: declared errors reject with their _tag`, async () => {
      const { tasks, jobs } = transports()[transport];
      const notFound = await tasks.getTask({ id: "missing" }).catch((e: unknown) => e);
      assert.ok(notFound instanceof ClientError);
      assert.equal(notFound.status, 404);
      assert.deepEqual(notFound.error, { _tag: "TaskNotFound", id: "missing", message: 'no task "missing"' });
      const jobMissing = await jobs.getJob({ jobId: "missing" }).catch((e: unknown) => e);
      assert.equal((jobMissing as ClientError)._tag, "JobNotFound");
      const invalid = await tasks.createTask({ title: 5 as unknown as string }).catch((e: unknown) => e);
      assert.equal((invalid as ClientError)._tag, "HttpApiDecodeError");
      assert.equal((invalid as ClientError).status, 400);
    });

    it(`client - ${transport}: jobs round trip and idempotent retries`, async () => {
      const { jobs } = transports()[transport];
      const id = await jobs.createJob({ content: "x" });
      assert.deepEqual(await jobs.getJob({ jobId: id }), { id, content: "x" });
      const key = crypto.randomUUID();
      assert.equal(await jobs.createJob({ content: "y" }, { idempotencyKey: key }), key);
      assert.equal(await jobs.createJob({ content: "y" }, { idempotencyKey: key }), key);
    });
  }

  it("client - an unreachable service rejects with ServiceUnavailable", async () => {
    const tasks = httpClient(taskApi, "http://127.0.0.1:1");
    const err = await tasks.getTask({ id: "x" }).catch((e: unknown) => e);
    assert.equal((err as ClientError)._tag, "ServiceUnavailable");
    const viaNats = natsClient(taskApi, svc.handle.nc, { prefix: "nobody-listens" });
    const natsErr = await viaNats.getTask({ id: "x" }).catch((e: unknown) => e);
    assert.equal((natsErr as ClientError)._tag, "ServiceUnavailable");
  });
});

// Durability across restarts of the service process and of its private nats-server.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { alive, serviceDataDir, startServiceProcess } from "./helpers/process.ts";
import { getJson, postJson } from "./helpers/service.ts";
import { startNatsServer } from "../platform/index.ts";

const ownNats = { NATS_URL: "" };

describe("restart", () => {
  it("restart - npm start's process keeps tasks, task objects and jobs across a restart", async (t) => {
    const dir = await serviceDataDir(t);
    const first = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => first.stop("SIGKILL"));
    const task = (await postJson(`${first.taskUrl}/`, { title: "durable" })).body as { id: string };
    const inObject = (await postJson(`${first.taskUrl}/do?name=keep`, { title: "durable do" })).body as { id: string };
    const jobId = (await postJson(`${first.jobUrl}/`, { content: "durable job" })).body as string;
    const natsPid = Number(await readFile(join(dir, "nats-server.pid"), "utf8"));
    assert.ok(alive(natsPid), "private nats-server runs");

    assert.equal(await first.stop(), 0, "clean exit on SIGTERM");
    assert.equal(alive(natsPid), false, "private nats-server stopped with the service");

    const second = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => second.stop("SIGKILL"));
    assert.deepEqual((await getJson(`${second.taskUrl}/${task.id}`)).body, task);
    assert.deepEqual((await getJson(`${second.taskUrl}/do/${inObject.id}?name=keep`)).body, inObject);
    assert.deepEqual((await getJson(`${second.jobUrl}/?jobId=${jobId}`)).body, { id: jobId, content: "durable job" });
    assert.equal(await second.stop(), 0);
  });

  it("restart - a stale nats-server left on the store (no live service) is replaced and the data kept", async (t) => {
    const dir = await serviceDataDir(t);
    const first = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    const task = (await postJson(`${first.taskUrl}/`, { title: "survives a stale server" })).body as { id: string };
    assert.equal(await first.stop(), 0);
    // What a killed service left where the parent-death signal is unavailable: a server on its
    // store, named by the pid file, with no service (the lock's pid is gone).
    const stale = await startNatsServer({ storeDir: join(dir, "nats") });
    t.after(() => stale.stop());
    await writeFile(join(dir, "nats-server.pid"), String(stale.pid));

    const second = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => second.stop("SIGKILL"));
    assert.equal(alive(stale.pid), false, "the stale server was stopped");
    assert.deepEqual((await getJson(`${second.taskUrl}/${task.id}`)).body, task);
    assert.equal(await second.stop(), 0);
  });

  it("restart - a bad configuration fails with a clear message", async () => {
    await assert.rejects(
      startServiceProcess({ TASK_API_PORT: "eighty" }),
      /TASK_API_PORT must be a non-negative integer/,
    );
    await assert.rejects(
      startServiceProcess({ NATS_URL: "", NATS_SERVER_BIN: "/nonexistent/nats-server" }),
      /error: NATS_SERVER_BIN names \/nonexistent\/nats-server, which is not an executable file: run scripts\/get-nats-server\.sh/,
    );
  });
});

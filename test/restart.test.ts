// Durability across restarts of the service process and of its private nats-server.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { alive, startServiceProcess } from "./helpers/process.ts";
import { getJson, postJson } from "./helpers/service.ts";

/** A data directory, removed after the test with any nats-server still running on it. */
async function dataDir(t: { after(fn: () => unknown): void }) {
  const dir = await mkdtemp(join(tmpdir(), "svc-data-"));
  t.after(async () => {
    const pid = Number(await readFile(join(dir, "nats-server.pid"), "utf8").catch(() => "0"));
    if (pid > 0 && alive(pid)) process.kill(pid, "SIGKILL");
    await rm(dir, { recursive: true, force: true });
  });
  return dir;
}

const ownNats = { NATS_URL: "" };

describe("restart", () => {
  it("restart - npm start's process keeps tasks, task objects and jobs across a restart", async (t) => {
    const dir = await dataDir(t);
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

  it("restart - a killed service's stale nats-server is replaced and the data kept", async (t) => {
    const dir = await dataDir(t);
    const first = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    const task = (await postJson(`${first.taskUrl}/`, { title: "survives kill -9" })).body as { id: string };
    const stalePid = Number(await readFile(join(dir, "nats-server.pid"), "utf8"));
    await first.stop("SIGKILL");
    assert.ok(alive(stalePid), "SIGKILL leaves the child nats-server behind");

    const second = await startServiceProcess({ ...ownNats, DATA_DIR: dir });
    t.after(() => second.stop("SIGKILL"));
    assert.equal(alive(stalePid), false, "the stale server was stopped");
    assert.deepEqual((await getJson(`${second.taskUrl}/${task.id}`)).body, task);
    assert.equal(await second.stop(), 0);
  });

  it("restart - a bad configuration fails with a clear message", async () => {
    await assert.rejects(startServiceProcess({ TASK_API_PORT: "eighty" }), /TASK_API_PORT must be a non-negative integer/);
    await assert.rejects(
      startServiceProcess({ NATS_URL: "", PATH: "/nonexistent" }),
      /nats-server is not on PATH/,
    );
  });
});

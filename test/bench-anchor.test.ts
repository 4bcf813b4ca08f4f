// The bench's no-hop anchor (bench/anchor-server.ts) as the bench starts it: bundled, on a
// nats-server with the service's per-role users plus the anchor's own login; and where its rows run.
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { anchorEnv, anchorLogin } from "../bench/anchor.ts";
import { selectWorkloads } from "../bench/rounds.ts";
import { callerEnv, startBuiltServer } from "../bench/stacks.ts";
import { authDirOf, authorizationConfig, ensureNatsCredentials, startNatsServer } from "../platform/index.ts";

it("bench anchor - creates a task in its own bucket under its own login, reads it back, 404 for one never created", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "bench-anchor-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const authDir = authDirOf(dir);
  const login = await anchorLogin(authDir);
  const authorization = authorizationConfig(await ensureNatsCredentials(authDir), "", [login.user]);
  const nats = await startNatsServer({ storeDir: join(dir, "nats"), authorization });
  t.after(() => nats.stop());
  const anchor = await startBuiltServer("anchor", "bench/anchor-server.ts", {
    ...callerEnv(),
    ...anchorEnv(nats.url, login),
  });
  t.after(() => anchor.child.stop());
  const url = `http://127.0.0.1:${anchor.port}`;

  const created = await fetch(`${url}/`, { method: "POST", body: JSON.stringify({ title: "bench" }) });
  assert.equal(created.status, 200);
  const task = (await created.json()) as { id: string; title: string; completed: boolean };
  assert.deepEqual({ ...task, id: "" }, { id: "", title: "bench", completed: false });
  const read = await fetch(`${url}/${task.id}`);
  assert.equal(read.status, 200);
  assert.deepEqual(await read.json(), task);
  assert.equal((await fetch(`${url}/${crypto.randomUUID()}`)).status, 404);
  const untitled = await fetch(`${url}/`, { method: "POST", body: JSON.stringify({ title: 1 }) });
  assert.equal(untitled.status, 400);
});

it("bench anchor - each anchor: row runs right after the service's row of the same name", () => {
  const only = ["anchor:getTaskMissing", "anchor:createTask", "createTask", "getTaskMissing", "anchor:getTask"];
  assert.deepEqual(
    selectWorkloads(only).map((w) => w.name),
    ["createTask", "anchor:createTask", "getTaskMissing", "anchor:getTaskMissing", "anchor:getTask"],
  );
});

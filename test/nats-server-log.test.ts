// The private nats-server's warnings and errors reach the service's own log (a disk that filled,
// a refused login), and the server's other lines stay out of it.
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { serverLogLine } from "../platform/server.ts";
import { loggedWithin, startServiceProcess } from "./helpers/process.ts";

test("nats-server log lines: warnings and errors are picked, with the pid and time taken off", () => {
  assert.deepEqual(
    serverLogLine("[4242] 2026/11/29 09:00:00.123456 [ERR] Filestore [KV_tasks] Critical write error: no space"),
    { level: "error", text: "Filestore [KV_tasks] Critical write error: no space" },
  );
  assert.deepEqual(serverLogLine("[1] 2026/11/29 09:00:00.123456 [WRN] JetStream resource limits exceeded"), {
    level: "warn",
    text: "JetStream resource limits exceeded",
  });
  assert.equal(serverLogLine("[1] 2026/11/29 09:00:00.123456 [INF] Server is ready"), undefined);
});

test("npm start's private nats-server: a refused login is in the service's log, its password is not", async (t) => {
  const dataDir = await mkdtemp(join(tmpdir(), "server-log-"));
  const svc = await startServiceProcess({ DATA_DIR: dataDir });
  t.after(async () => {
    await svc.stop();
    await rm(dataDir, { recursive: true, force: true });
  });
  const url = (await readFile(join(dataDir, "nats-url"), "utf8")).trim();
  const password = "not-the-password-4b1d";
  await assert.rejects(connect({ servers: url, user: "intruder", pass: password, reconnect: false }), /Authorization/);
  const entry = await loggedWithin(svc, 10_000, (e) => e.component === "nats-server" && /intruder/.test(String(e.msg)));
  // pino's levels: 40 warn, 50 error (the server prints a refused login as [ERR]).
  assert.ok(Number(entry.level) >= 40, `a refused login is a warning or an error: ${JSON.stringify(entry)}`);
  assert.ok(!JSON.stringify(svc.logs).includes(password), "the password tried is never logged");
  assert.ok(
    !svc.logs.some((e) => e.component === "nats-server" && /Server is ready/.test(String(e.msg))),
    "the server's info lines stay out of the service's log",
  );
});

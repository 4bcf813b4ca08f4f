// `npm run bench -- --nats-compare PATH`: the rows measured again on another nats-server,
// each right after its own row, named by that server's version.
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { natsServerLabel, withCompared } from "../bench/nats-compare.ts";
import { parseOptions } from "../bench/options.ts";
import { selectWorkloads } from "../bench/rounds.ts";
import { baseline, type WorkloadContext } from "../bench/workloads.ts";

describe("bench --nats-compare", () => {
  it("bench --nats-compare - each row on the service's stacks is followed by its twin; bare and :noauth have none", async () => {
    assert.equal(parseOptions(["--nats-compare", "/opt/nats-2.10"]).natsCompare, "/opt/nats-2.10");
    const only = ["createTask", "createTask:noauth", "createTask:r3", "getTask"];
    const rows = withCompared([baseline, ...selectWorkloads(only)], "v2.10.27");
    assert.deepEqual(
      rows.map((w) => w.name),
      [
        "bare node:http",
        "createTask",
        "createTask @v2.10.27",
        "getTask",
        "getTask @v2.10.27",
        "createTask:noauth",
        "createTask:r3",
        "createTask:r3 @v2.10.27",
      ],
    );
    const twin = rows.find((w) => w.name === "createTask:r3 @v2.10.27")!;
    assert.equal(twin.onCompared, true);
    assert.equal(twin.serviceGroup, "r3");
    // It prepares the same workload against the compared stacks' URLs.
    const context = (url: string) => ({ r3: { "1s": { taskUrl: url } } }) as unknown as WorkloadContext;
    await assert.rejects(twin.prepare(context("http://main")), /--nats-compare stacks were not started/);
    const runner = await twin.prepare({ ...context("http://main"), compared: context("http://compared") });
    assert.equal(typeof runner, "function");
    assert.deepEqual(withCompared(rows.slice(0, 2), undefined), rows.slice(0, 2), "no twins without the option");
  });

  it("bench --nats-compare - the rows are named by the binary's version; anything else is a usage error", async (t) => {
    const dir = await mkdtemp(join(tmpdir(), "bench-compare-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const binary = join(dir, "nats-server");
    await writeFile(binary, '#!/bin/sh\necho "nats-server: v2.10.27"\n');
    await chmod(binary, 0o755);
    assert.equal(natsServerLabel(binary), "v2.10.27");
    assert.throws(() => natsServerLabel(join(dir, "missing")), { name: "UsageError", message: /does not run/ });
    assert.throws(() => natsServerLabel("/bin/true"), { name: "UsageError", message: /is not a nats-server/ });
  });
});

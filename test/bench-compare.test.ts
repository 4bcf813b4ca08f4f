// `npm run bench -- --nats-compare PATH` and `--service-compare DIR`: the rows measured again on
// another nats-server or another checkout's service, each right after its own row, named by that
// server's version or that checkout's commit.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { checkoutLabel, natsServerLabel, roundOrder, twinPairs, withCompared } from "../bench/compared.ts";
import { permissionsOf } from "../bench/environment.ts";
import { authorizationConfig } from "../platform/index.ts";
import type { Measurement } from "../bench/types.ts";
import { parseOptions } from "../bench/options.ts";
import { selectWorkloads } from "../bench/rounds.ts";
import { baseline, type WorkloadContext } from "../bench/workloads.ts";

describe("bench --nats-compare", () => {
  it("bench --nats-compare - each row on the service's stacks is followed by its twin; bare and :noauth have none", async () => {
    assert.equal(parseOptions(["--nats-compare", "/opt/nats-2.10"]).natsCompare, "/opt/nats-2.10");
    const only = ["createTask", "createTask:noauth", "createTask:r3", "getTask"];
    const rows = withCompared([baseline, ...selectWorkloads(only)], { kind: "nats", label: "v2.10.27" });
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
    await assert.rejects(twin.prepare(context("http://main")), /compared stacks were not started/);
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

describe("bench --service-compare", () => {
  it("bench --service-compare - every service row has a twin, :noauth too (its service differs); bare has none", () => {
    assert.equal(parseOptions(["--service-compare", "/tmp/before"]).serviceCompare, "/tmp/before");
    const only = ["createTask", "createTask:noauth", "nats:getTask"];
    const rows = withCompared([baseline, ...selectWorkloads(only)], { kind: "service", label: "624b62c" });
    assert.deepEqual(
      rows.map((w) => w.name),
      [
        "bare node:http",
        "createTask",
        "createTask @624b62c",
        "createTask:noauth",
        "createTask:noauth @624b62c",
        "nats:getTask",
        "nats:getTask @624b62c",
      ],
    );
    assert.match(rows[2]!.summary, /the service at 624b62c$/);
  });

  it("bench --service-compare - the rows are named by the checkout's commit (+ when changed); anything else is a usage error", async (t) => {
    const dir = await mkdtemp(join(tmpdir(), "bench-service-compare-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    assert.throws(() => checkoutLabel(dir), { name: "UsageError", message: /no main\.ts there/ });
    await writeFile(join(dir, "main.ts"), "export {};\n");
    assert.throws(() => checkoutLabel(dir), { name: "UsageError", message: /no node_modules there/ });
    await mkdir(join(dir, "node_modules"));
    const git = (...args: string[]) => execFileSync("git", ["-C", dir, ...args], { encoding: "utf8" }).trim();
    git("init", "-q");
    git("add", "main.ts");
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x");
    const commit = git("rev-parse", "--short", "HEAD");
    assert.deepEqual(checkoutLabel(dir), { checkout: dir, label: commit });
    await writeFile(join(dir, "main.ts"), "export const changed = 1;\n");
    assert.equal(checkoutLabel(dir).label, `${commit}+`);
  });

  it("bench --service-compare - the twin's nats-server grants what that checkout's services use, from its own nats-auth.ts", async (t) => {
    assert.equal(await permissionsOf(undefined), authorizationConfig, "this checkout's own");
    const dir = await mkdtemp(join(tmpdir(), "bench-perms-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    await mkdir(join(dir, "platform"));
    await writeFile(
      join(dir, "platform/nats-auth.ts"),
      'export function authorizationConfig(credentials: unknown, prefix = "") { ' +
        "return `authorization { other checkout ${prefix} }`; }\n",
    );
    const other = await permissionsOf(dir);
    assert.notEqual(other, authorizationConfig);
    assert.equal(other({} as never, "p"), "authorization { other checkout p }");
  });
});

describe("bench twin rows", () => {
  const m = (rps: number, cpuSeconds: number, p99 = 10): Measurement => ({
    requests: rps * 4,
    seconds: 4,
    rps,
    p50: 1,
    p99,
    errors: 0,
    timeouts: 0,
    unexpected: 0,
    expected: 0,
    statusCodes: {},
    errorSamples: [],
    rssMiB: {},
    cpuSeconds: { service: cpuSeconds, nats: 0 },
    machineCpuSeconds: cpuSeconds,
  });

  it("bench twin rows - each pair is compared within its round, so drift between rounds cancels", () => {
    const rounds = [
      // The machine halves its speed in round 2: both sides move, their ratio does not.
      { round: 1, results: { getTask: m(1000, 1), "getTask @abc": m(800, 1) } },
      { round: 2, results: { getTask: m(500, 1), "getTask @abc": m(400, 1) } },
      { round: 3, results: { getTask: m(1000, 2, 20), "getTask @abc": { error: "setup failed" } } },
    ];
    const [pair, ...rest] = twinPairs(rounds, ["bare node:http", "getTask", "getTask @abc"], "abc");
    assert.equal(rest.length, 0);
    assert.equal(pair!.workload, "getTask");
    assert.equal(pair!.rounds, 2, "a round whose twin failed is left out");
    assert.equal(pair!.rps.median, 1.25);
    assert.equal(pair!.rps.min, 1.25);
    // CPU per request: 1 s over 4000 requests against 1 s over 3200.
    assert.equal(pair!.cpu.median, 0.8);
  });

  it("bench twin rows - even rounds run each twin before its row, odd rounds after", () => {
    const rows = [
      { name: "bare" },
      { name: "a" },
      { name: "a @x", onCompared: true },
      { name: "b" },
      { name: "b @x", onCompared: true },
    ];
    const names = (round: number) => roundOrder(rows, round).map((r) => r.name);
    assert.deepEqual(names(1), ["bare", "a", "a @x", "b", "b @x"]);
    assert.deepEqual(names(2), ["bare", "a @x", "a", "b @x", "b"]);
    assert.deepEqual(names(3), names(1));
  });
});

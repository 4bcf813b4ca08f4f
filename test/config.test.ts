// The service's configuration module: defaults, one-line errors naming the variable, the
// flags, and every variable it reads documented under docs/ (the start-up errors of a real
// process are in startup-errors.test.ts).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import { ConfigError, configVariables, readConfig, readFlags } from "../config.ts";

/** The ConfigError `read` throws (fails when it throws none or another error). */
function configError(read: () => unknown): ConfigError {
  try {
    read();
  } catch (err) {
    assert.ok(err instanceof ConfigError, `not a ConfigError: ${String(err)}`);
    return err;
  }
  assert.fail("no ConfigError");
}

describe("config - environment", () => {
  it("config - defaults without any variable", () => {
    const { service, placement, microvmHost } = readConfig({});
    assert.equal(service.natsUrl, undefined);
    assert.deepEqual([service.taskPort, service.jobPort, service.microvmPort], [8787, 8788, 8789]);
    assert.equal(service.host, "127.0.0.1");
    assert.equal(service.prefix, "");
    assert.equal(service.localReads, true);
    assert.equal(placement.ttlMs, 2_000);
    assert.equal(microvmHost.provider, "auto");
    assert.equal(microvmHost.snapshots, true);
    assert.equal(microvmHost.limits.launchSnapshots, true);
    assert.deepEqual(microvmHost.logLimits, { linesPerInstance: 1000, maxAgeSeconds: 86_400, storeMiB: 256 });
    assert.equal(placement.maxPending, 256);
    assert.equal(microvmHost.imageQuota.bytes, 64 * 1024 * 1024);
    assert.equal(microvmHost.limits.cpus, undefined);
    assert.deepEqual(microvmHost.objects, { maxActive: 50, maxActivePerPrincipal: 10 });
  });

  it("config - values are read and typed", () => {
    const { service, placement, microvmHost } = readConfig({
      TASK_API_PORT: "0",
      NATS_SUBJECT_PREFIX: "svc",
      GATEWAY_LOCAL_READS: "0",
      API_HOSTNAMES: " Api.Example.com, ,b.example ",
      TASK_OBJECT_LOG_WRITES: "1",
      MICROVM_SNAPSHOTS: "0",
      MICROVM_LAUNCH_SNAPSHOTS: "0",
      MICROVM_LOG_LINES: "50",
      TASK_OBJECT_MAX_PENDING: "8",
      MICROVM_PROVIDER: "sandbox",
      MICROVM_CPUS: "0.5",
      MICROVM_MEMORY_MIB: "128",
      MICROVM_OBJECTS_MAX_ACTIVE: "20",
      MICROVM_OBJECTS_PER_PRINCIPAL: "4",
    });
    assert.equal(service.taskPort, 0);
    assert.equal(service.prefix, "svc");
    assert.equal(service.localReads, false);
    assert.deepEqual(service.hostNames, ["api.example.com", "b.example"]);
    assert.equal(placement.logWrites, true);
    assert.equal(microvmHost.snapshots, false);
    assert.equal(microvmHost.limits.launchSnapshots, false);
    assert.equal(microvmHost.logLimits.linesPerInstance, 50);
    assert.equal(placement.maxPending, 8);
    assert.equal(microvmHost.provider, "sandbox");
    assert.equal(microvmHost.limits.cpus, 0.5);
    assert.equal(microvmHost.limits.memoryMiB, 128);
    assert.deepEqual(microvmHost.objects, { maxActive: 20, maxActivePerPrincipal: 4 });
  });

  it("config - a bad value is one line naming the variable, what it must be and what it got", () => {
    const cases: [Record<string, string>, string][] = [
      [{ TASK_API_PORT: "70000" }, 'TASK_API_PORT must be a port from 0 to 65535 (0 picks a free one), got "70000"'],
      [{ REQUEST_TIMEOUT_MS: "-1" }, 'REQUEST_TIMEOUT_MS must be a non-negative integer, got "-1"'],
      [{ READ_CACHE_ENTRIES: "1.5" }, 'READ_CACHE_ENTRIES must be a non-negative integer, got "1.5"'],
      [{ TASK_OBJECT_LEASE_MS: "0" }, "TASK_OBJECT_LEASE_MS must be positive"],
      [{ MICROVM_PIDS: "0" }, "MICROVM_PIDS must be positive"],
      [{ MICROVM_OBJECTS_PER_PRINCIPAL: "0" }, "MICROVM_OBJECTS_PER_PRINCIPAL must be positive"],
      [{ MICROVM_CPUS: "lots" }, 'MICROVM_CPUS must be a number of cores such as 0.5, got "lots"'],
      [
        { MICROVM_PROVIDER: "docker" },
        'MICROVM_PROVIDER must be "auto" (default: gvisor, else sandbox), "gvisor", "sandbox" or "process", ' +
          'got "docker"',
      ],
    ];
    for (const [env, message] of cases) {
      const err = configError(() => readConfig(env));
      assert.equal(err.message, message);
      assert.equal(err.exitCode, 1);
      assert.ok(!err.message.includes("\n"));
    }
    assert.match(configError(() => readConfig({ NATS_SYNC: "sometimes" })).message, /NATS_SYNC/);
  });

  it("config - every variable it reads is documented under docs/", async () => {
    readConfig({});
    const dir = new URL("../docs/", import.meta.url);
    const pages = await Promise.all(
      (await readdir(dir)).filter((f) => f.endsWith(".md")).map((f) => readFile(new URL(f, dir), "utf8")),
    );
    const docs = pages.join("\n");
    assert.ok(configVariables.size >= 40, `read ${configVariables.size} variables`);
    const missing = [...configVariables].filter((name) => !docs.includes(`\`${name}\``));
    assert.deepEqual(missing, [], "variables read by config.ts that no page under docs/ names in code");
  });
});

describe("config - flags", () => {
  it("config - every role by default; --role names some (comma-separated or repeated); all is every role", () => {
    const all = readFlags([]);
    assert.ok(all.kind === "run" && !all.explicit && all.roles.size === 3);
    const some = readFlags(["--role", "gateway,actors", "--role", "actors"]);
    assert.ok(some.kind === "run" && some.explicit);
    assert.deepEqual([...some.roles].sort(), ["actors", "gateway"]);
    const every = readFlags(["--role", "all"]);
    assert.ok(every.kind === "run" && !every.explicit && every.roles.size === 3);
    assert.deepEqual(readFlags(["--help"]), { kind: "help" });
    assert.deepEqual(readFlags(["-v"]), { kind: "version" });
  });

  it("config - an unknown role exits 1, a flag that does not parse exits 2", () => {
    const role = configError(() => readFlags(["--role", "db"]));
    assert.equal(role.message, 'unknown role "db" (use gateway, actors, microvms or all)');
    assert.equal(role.exitCode, 1);
    const flag = configError(() => readFlags(["--bogus"]));
    assert.match(flag.message, /--bogus.*\(npm start -- --help\)$/);
    assert.equal(flag.exitCode, 2);
  });
});

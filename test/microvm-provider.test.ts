// Tests of the process provider with real instance processes: readiness, SIGSTOP/SIGCONT,
// termination (graceful and forced), the scrubbed environment, the permission model and
// the memory caps. Ends by checking that no instance process is left running.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { createInterface } from "node:readline";
import { tmpdir } from "node:os";
import { testImages } from "./images/paths.ts";
import { join } from "node:path";
import {
  builtinImages,
  createProcessProvider,
  MicrovmProviderError,
  type MicrovmHandle,
} from "../vm-runtime/service/index.ts";
import { childProcessesWith, readProcStat, residentBytes } from "../vm-runtime/host/proc.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";

const provider = createProcessProvider();

after(async () => {
  await provider.close();
  assert.deepEqual(childProcessesWith(process.pid, INSTANCE_MARKER), [], "an instance process was left running");
});

async function call(handle: MicrovmHandle, method: string, args: unknown[] = [], timeoutMs = 5_000) {
  const response = await fetch(`http://127.0.0.1:${handle.ports["8080"]}/__rpc__/${method}`, {
    method: "POST",
    body: JSON.stringify(args),
    headers: { ...handle.upstreamHeaders },
    signal: AbortSignal.timeout(timeoutMs),
  });
  return (await response.json()) as unknown;
}

async function start(id: string, image: string = testImages.probe, memoryMiB?: number) {
  return provider.start({ microvmId: id, image, ...(memoryMiB === undefined ? {} : { memoryMiB }) });
}

test("provider - start resolves once the runtime answers HTTP", async (t) => {
  const began = performance.now();
  const handle = await start("p-start");
  const startMs = performance.now() - began;
  t.after(() => provider.terminate(handle));
  assert.equal(handle.provider, "process");
  assert.equal(readProcStat(handle.pid!)?.pgrp, handle.pid, "the instance leads its own process group");
  assert.equal(await call(handle, "pid"), handle.pid);
  assert.deepEqual(
    provider.live().map((h) => h.microvmId),
    ["p-start"],
  );
  const warmBegan = performance.now();
  const warm = await start("p-start-warm");
  const warmMs = performance.now() - warmBegan;
  await provider.terminate(warm);
  t.diagnostic(
    `start-to-answering: ${startMs.toFixed(0)} ms with bundling, ${warmMs.toFixed(0)} ms bundle cached; ` +
      `instance RSS ${(residentBytes(handle.pid!)! / 2 ** 20).toFixed(1)} MiB`,
  );
});

test("provider - suspend stops the process (state T) and resume brings the runtime back", async (t) => {
  const handle = await start("p-suspend");
  t.after(() => provider.terminate(handle));
  let began = performance.now();
  await provider.suspend(handle);
  const suspendMs = performance.now() - began;
  assert.equal(readProcStat(handle.pid!)?.state, "T");
  await assert.rejects(call(handle, "pid", [], 200), /timeout|aborted/i, "a stopped runtime must not answer");
  began = performance.now();
  await provider.resume(handle);
  const resumeMs = performance.now() - began;
  assert.notEqual(readProcStat(handle.pid!)?.state, "T");
  assert.equal(await call(handle, "pid"), handle.pid);
  t.diagnostic(`suspend ${suspendMs.toFixed(1)} ms, resume-to-answering ${resumeMs.toFixed(1)} ms`);
});

test("provider - terminate ends the process and is idempotent", async () => {
  const handle = await start("p-terminate");
  await provider.terminate(handle);
  assert.equal(await provider.isAlive(handle), false);
  assert.equal(readProcStat(handle.pid!), undefined);
  await provider.terminate(handle);
  assert.ok(!provider.live().some((h) => h.microvmId === "p-terminate"));
});

test("provider - terminate ends a suspended instance", async () => {
  const handle = await start("p-terminate-stopped");
  await provider.suspend(handle);
  await provider.terminate(handle, 1_000);
  assert.equal(await provider.isAlive(handle), false);
});

test("provider - terminate escalates to SIGKILL after the grace period", async () => {
  const handle = await start("p-stubborn");
  void call(handle, "spin", [20_000], 30_000).catch(() => undefined);
  await new Promise((resolve) => setTimeout(resolve, 100));
  const began = Date.now();
  await provider.terminate(handle, 200);
  const took = Date.now() - began;
  assert.equal(await provider.isAlive(handle), false);
  assert.ok(took >= 190 && took < 3_000, `took ${took} ms`);
});

test("provider - a handle whose pid was reused is never signalled", async (t) => {
  const handle = await start("p-reuse");
  t.after(() => provider.terminate(handle));
  const stranger = { ...handle, pidStartTime: (handle.pidStartTime ?? 0) + 1 };
  assert.equal(await provider.isAlive(stranger), false);
  await assert.rejects(provider.suspend(stranger), MicrovmProviderError);
  await provider.terminate(stranger);
  assert.notEqual(readProcStat(handle.pid!)?.state, "T");
  assert.equal(await provider.isAlive(handle), true);
});

test("provider - the instance environment is scrubbed of host secrets", async (t) => {
  process.env.NATS_CREDS = "secret-creds";
  process.env.MICROVM_TOKEN_KEY = "secret-key";
  t.after(() => {
    delete process.env.NATS_CREDS;
    delete process.env.MICROVM_TOKEN_KEY;
  });
  const handle = await start("p-env");
  t.after(() => provider.terminate(handle));
  assert.deepEqual(await call(handle, "envKeys"), [
    "HOME",
    "LANG",
    "MICROVM_ID",
    "MICROVM_RUNTIME_PORT",
    "NODE_ENV",
    "PATH",
    "PWD",
    "TMPDIR",
  ]);
});

test("provider - the permission model denies host files and child processes", async (t) => {
  const handle = await start("p-perm");
  t.after(() => provider.terminate(handle));
  assert.equal(await call(handle, "readFile", ["/etc/hostname"]), "ERR_ACCESS_DENIED");
  assert.equal(await call(handle, "readFile", [new URL(import.meta.url).pathname]), "ERR_ACCESS_DENIED");
  assert.equal(await call(handle, "spawn"), "ERR_ACCESS_DENIED");
  assert.equal(await call(handle, "writeScratch"), "allowed", "its own scratch directory is writable");
});

test("provider - the heap cap stops a memory hog without harming the host", async (t) => {
  const hostRssBefore = process.memoryUsage().rss;
  const handle = await start("p-hog", testImages.hog, 64);
  t.after(() => provider.terminate(handle));
  assert.equal(await call(handle, "ping"), "pong");
  await assert.rejects(call(handle, "hog", [], 20_000));
  await waitUntil(() => readProcStat(handle.pid!) === undefined, 5_000);
  assert.equal(await provider.isAlive(handle), false);
  assert.ok(process.memoryUsage().rss - hostRssBefore < 64 * 2 ** 20, "the host grew with the hog");
});

test("provider - the data limit stops off-heap allocation", async (t) => {
  const handle = await start("p-buffers", testImages.hog, 64);
  t.after(() => provider.terminate(handle));
  // Either way the limit stops it: an allocation V8 cannot survive ends the process (the call
  // fails), or a buffer's allocation fails as a RangeError the method throws, which the runtime
  // answers as the method's error (500) while the process lives on within its limit.
  const answer = await fetch(`http://127.0.0.1:${handle.ports["8080"]}/__rpc__/hogBuffers`, {
    method: "POST",
    body: "[]",
    headers: { ...handle.upstreamHeaders },
    signal: AbortSignal.timeout(20_000),
  }).then(
    async (response) => ({ status: response.status, body: await response.text() }),
    () => undefined,
  );
  if (answer === undefined) {
    await waitUntil(() => readProcStat(handle.pid!) === undefined, 5_000);
    assert.equal(await provider.isAlive(handle), false);
    return;
  }
  assert.equal(answer.status, 500, `the hog's call answered ${answer.status}: ${answer.body.slice(0, 200)}`);
  assert.match(
    answer.body,
    /ERR_MEMORY_ALLOCATION_FAILED|allocation failed|out of memory/i,
    `its answer: ${answer.body.slice(0, 300)}`,
  );
  t.diagnostic("the allocation failed inside the instance, which answered it as the method's error");
});

test("provider - an image that fails to load rejects start with its error and leaves no process", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "vm-broken-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const image = join(dir, "broken.ts");
  await writeFile(image, 'throw new Error("broken image at import");\nexport default 1;\n');
  const liveBefore = provider.live().length;
  await assert.rejects(start("p-broken", image), (error: unknown) => {
    assert.ok(error instanceof MicrovmProviderError);
    assert.match(String((error as Error).cause), /broken image at import/);
    return true;
  });
  assert.equal(provider.live().length, liveBefore);
});

test("provider - aborting a start kills the half-started instance", async () => {
  const controller = new AbortController();
  const starting = provider.start({ microvmId: "p-abort", image: testImages.probe }, controller.signal);
  setTimeout(() => controller.abort(), 30);
  await assert.rejects(starting, MicrovmProviderError);
  assert.ok(!provider.live().some((h) => h.microvmId === "p-abort"));
});

test("provider - an instance exits when its host process dies", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "vm-host-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const hostScript = join(dir, "host.mjs");
  const index = new URL("../vm-runtime/index.ts", import.meta.url).href;
  await writeFile(
    hostScript,
    `import { createProcessProvider } from ${JSON.stringify(index)};\n` +
      `const provider = createProcessProvider({ workDir: ${JSON.stringify(join(dir, "work"))} });\n` +
      `const handle = await provider.start({ microvmId: "orphan", image: ${JSON.stringify(testImages.probe)} });\n` +
      `console.log(JSON.stringify({ pid: handle.pid }));\n` +
      `setInterval(() => undefined, 1000);\n`,
  );
  const host = spawn(process.execPath, ["--import", "tsx", hostScript], { stdio: ["ignore", "pipe", "inherit"] });
  const pid = await new Promise<number>((resolve, reject) => {
    createInterface({ input: host.stdout! }).once("line", (text) => resolve((JSON.parse(text) as { pid: number }).pid));
    host.once("exit", () => reject(new Error("host exited before starting its instance")));
  });
  t.after(() => {
    if (readProcStat(pid)) process.kill(pid, "SIGKILL");
  });
  assert.ok(readProcStat(pid), "the instance runs");
  host.kill("SIGKILL");
  await waitUntil(() => readProcStat(pid) === undefined || readProcStat(pid)?.state === "Z", 5_000);
});

async function waitUntil(condition: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("provider - prepare bundles images ahead of their first start; close waits for it", async (t) => {
  const workDir = await mkdtemp(join(tmpdir(), "vm-prepare-"));
  t.after(() => rm(workDir, { recursive: true, force: true }));
  const own = createProcessProvider({ workDir });
  await own.prepare([builtinImages.sandbox]);
  const [instanceDir] = await readdir(workDir);
  const built = (await readdir(join(workDir, instanceDir!, "images"))).filter((name) => name.endsWith(".mjs")).sort();
  assert.equal(built.length, 2, "the runtime bundle and the image's module");
  assert.equal(built[1], "runtime.mjs");
  const pending = own.prepare([testImages.probe, testImages.hog]);
  await own.close();
  await pending.catch(() => undefined);
  assert.deepEqual(await readdir(workDir), [], "nothing is written after close");
});

test("provider - prepare reports an image that cannot be bundled", async () => {
  const own = createProcessProvider();
  await assert.rejects(own.prepare(["/nonexistent/image.ts"]));
  await own.close();
});

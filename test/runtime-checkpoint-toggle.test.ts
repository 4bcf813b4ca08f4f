// Before a checkpoint the host tells the runtime to close its listener (a wall cannot save a
// bound host socket): the runtime says so once the socket itself is closed, not only its file
// gone (node unlinks the file first), and listens again when told.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { CLOSED_LINE, CONTROL_LINES } from "../vm-runtime/runtime/boot.ts";

/** Whether a Unix socket bound to `path` exists in the kernel's table (an unlinked one still does). */
const socketBound = (path: string) =>
  readFileSync("/proc/net/unix", "utf8")
    .split("\n")
    .some((row) => row.trimEnd().endsWith(` ${path}`));

test("runtime - told to close before a checkpoint, it says so once its socket is closed, and listens again", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "runtime-toggle-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const socket = join(dir, "runtime.sock");
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(import.meta.dirname, "helpers/runtime-toggle-child.ts"), socket],
    {
      stdio: ["pipe", "pipe", "inherit"],
    },
  );
  t.after(() => child.kill("SIGKILL"));
  const lines = createInterface({ input: child.stdout! });
  const iterator = lines[Symbol.asyncIterator]();
  /** Reads up to the line `want`; a runtime that never prints it fails the test in 30 s (a loaded machine's start). */
  const nextLine = async (want: string) => {
    const late = AbortSignal.timeout(30_000);
    for (;;) {
      const read = await Promise.race([
        iterator.next(),
        new Promise<never>((_, reject) => late.addEventListener("abort", () => reject(new Error(`no ${want} line`)))),
      ]);
      assert.ok(!read.done, `the runtime ended before printing ${want}`);
      if (read.value === want) return;
    }
  };
  await nextLine("serving");
  assert.ok(socketBound(socket), "listening: its socket is bound");
  for (let round = 1; round <= 3; round++) {
    child.stdin!.write(`${CONTROL_LINES.close}\n`);
    await nextLine(CLOSED_LINE);
    // Read at the moment it says so: the socket is gone, not only its file.
    assert.equal(socketBound(socket), false, `round ${round}: the socket is still bound when the runtime says closed`);
    assert.equal(existsSync(socket), false);
    child.stdin!.write(`${CONTROL_LINES.listen}\n`);
    const deadline = Date.now() + 10_000;
    while (!existsSync(socket)) {
      assert.ok(Date.now() < deadline, `round ${round}: the runtime did not listen again`);
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(socketBound(socket));
  }
  const exited = once(child, "exit");
  child.kill();
  await exited;
});

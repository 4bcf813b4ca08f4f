// The bounded splitter that reads instance output: long lines are cut, a flood is paced, and
// nothing it keeps grows with the input.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { boundedLines } from "../vm-runtime/host/output-lines.ts";

test("output lines - lines are split, and a line past the limit is cut with a mark", async () => {
  const stream = new PassThrough();
  const lines: string[] = [];
  const stats = boundedLines(stream, (line) => lines.push(line), { maxLineBytes: 16 });
  stream.write("short\nanother one\n");
  stream.write("x".repeat(40));
  stream.end("y\nlast");
  await new Promise((resolve) => stream.on("end", resolve));
  assert.deepEqual(lines, ["short", "another one", `${"x".repeat(16)} …[cut]`, "last"]);
  assert.equal(stats.cutLines, 1);
});

test("output lines - 64 MiB without a newline keeps one bounded line, and the pipe is paced", async () => {
  const stream = new PassThrough({ highWaterMark: 64 * 1024 });
  const lines: string[] = [];
  const stats = boundedLines(stream, (line) => lines.push(line), {
    bytesPerSecond: 256 * 1024 * 1024,
    burstBytes: 8 * 1024 * 1024,
  });
  const chunk = Buffer.alloc(1024 * 1024, "z");
  const before = process.memoryUsage().arrayBuffers;
  for (let i = 0; i < 64; i++) if (!stream.write(chunk)) await new Promise((resolve) => stream.once("drain", resolve));
  const grown = process.memoryUsage().arrayBuffers - before;
  stream.end("\n");
  await new Promise((resolve) => stream.on("end", resolve));
  assert.equal(lines.length, 1);
  assert.equal(lines[0]!.length, 8 * 1024 + " …[cut]".length);
  assert.ok(stats.pauses > 0, "a 64 MiB burst past an 8 MiB budget was never paused");
  assert.ok(grown < 32 * 1024 * 1024, `buffers grew by ${(grown / 2 ** 20).toFixed(1)} MiB while reading`);
});

test("output lines - a flood of empty lines is paced by a cost per line", async () => {
  const stream = new PassThrough({ highWaterMark: 64 * 1024 });
  let lines = 0;
  const limits = { bytesPerSecond: 1024 * 1024, burstBytes: 1024 * 1024, lineCostBytes: 128 };
  const stats = boundedLines(stream, () => (lines += 1), limits);
  const chunk = Buffer.alloc(64 * 1024, "\n");
  const began = performance.now();
  const cpuBefore = process.cpuUsage();
  // The writer keeps 64 KiB of newlines offered for 1.5 s; the reader takes what its budget allows.
  while (performance.now() - began < 1_500) {
    if (!stream.write(chunk)) await new Promise((resolve) => stream.once("drain", resolve));
  }
  const seconds = (performance.now() - began) / 1000;
  const cpu = process.cpuUsage(cpuBefore);
  stream.destroy();
  // Each line costs 129 bytes of a budget of burst + rate * elapsed.
  const allowed = (limits.burstBytes + limits.bytesPerSecond * seconds) / (1 + limits.lineCostBytes);
  const cpuShare = (cpu.user + cpu.system) / 1e6 / seconds;
  console.log(
    `# ${lines} empty lines in ${seconds.toFixed(2)} s (allowed ${allowed.toFixed(0)}), ${cpuShare.toFixed(2)} of ` +
      `a core`,
  );
  assert.ok(lines > 0, "no line was read");
  assert.ok(stats.pauses > 0, "the flood was never paused");
  // One chunk may be read past the budget before the pause takes effect.
  assert.ok(lines <= allowed + chunk.length, `${lines} lines read, ${allowed.toFixed(0)} allowed`);
});

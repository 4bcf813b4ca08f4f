// The bounded splitter that reads instance output: long lines are cut, a flood is paced, and
// nothing it keeps grows with the input.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { boundedLines } from "../vm-runtime/index.ts";

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

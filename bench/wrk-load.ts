// HTTP load with `wrk` (Debian package `wrk`), a C load generator in its own process: it takes
// less of the two cores than autocannon in this process, so the service gets more of them.
// Per-request paths are sampled from `next()` into a Lua table the script cycles through.
import { execFileSync, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { tempDir } from "./children.ts";
import type { HttpLoadSpec, HttpRequestSpec, LoadResult, LoadSettings } from "./types.ts";

/** Requests sampled from a dynamic `next()`: enough to cycle over every seeded record. */
const SAMPLED_REQUESTS = 20_000;
const RESULT_MARK = "WRK_RESULT ";

/** `wrk`'s version line when it is installed, else undefined. */
export function wrkVersion(): string | undefined {
  try {
    // wrk prints its usage (with the version on the first line) and exits 1 on -v.
    execFileSync("wrk", ["-v"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (err) {
    const out = `${(err as { stdout?: string }).stdout ?? ""}`;
    const line = out.split("\n", 1)[0]?.trim();
    if (line?.startsWith("wrk")) return line.replace(/ Copyright.*$/, "");
  }
  return undefined;
}

const lua = (s: string) => JSON.stringify(s); // a JSON string is a valid Lua string literal here

function requestLua(r: HttpRequestSpec): string {
  const headers = r.body === undefined ? "nil" : `{["Content-Type"]="application/json"}`;
  return `wrk.format(${lua(r.method)}, ${lua(r.path)}, ${headers}, ${r.body === undefined ? "nil" : lua(r.body)})`;
}

/** The Lua script: fixed or cycled requests, a status count when a non-2xx is expected, a JSON summary. */
function script(spec: HttpLoadSpec): string {
  const first = spec.next();
  const lines: string[] = [];
  // Requests are formatted in init(): wrk sets the Host header just before calling it.
  if (spec.fixed) {
    lines.push(
      `local fixed`,
      `init = function(args) fixed = ${requestLua(first)} end`,
      `request = function() return fixed end`,
    );
  } else {
    const sampled = [first, ...Array.from({ length: SAMPLED_REQUESTS - 1 }, () => spec.next())];
    lines.push(
      `local reqs = {}`,
      `local n = ${sampled.length}`,
      `local i = 0`,
      `init = function(args)`,
      ...sampled.map((r) => `  table.insert(reqs, ${requestLua(r)})`),
      // Threads start at different offsets, so they do not ask for the same records in step.
      `  i = math.random(n)`,
      `end`,
      `request = function() i = i % n + 1; return reqs[i] end`,
    );
  }
  if (spec.expectedStatus !== undefined) {
    lines.push(
      `expected = 0`,
      `response = function(status) if status == ${spec.expectedStatus} then expected = expected + 1 end end`,
    );
  }
  lines.push(
    `local threads = {}`,
    `setup = function(thread) table.insert(threads, thread) end`,
    `done = function(summary, latency, requests)`,
    `  local expected_total = 0`,
    `  for _, t in ipairs(threads) do expected_total = expected_total + (t:get("expected") or 0) end`,
    `  local e = summary.errors`,
    `  io.write(string.format('${RESULT_MARK}{"requests":%d,"micros":%d,"p50":%d,"p99":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"expected":%d}\\n',`,
    `    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.connect, e.read, e.write, e.status, e.timeout, expected_total))`,
    `end`,
  );
  return lines.join("\n");
}

interface WrkSummary {
  requests: number;
  micros: number;
  p50: number;
  p99: number;
  connect: number;
  read: number;
  write: number;
  status: number;
  timeout: number;
  expected: number;
}

function toResult(s: WrkSummary, expectedStatus: number | undefined): LoadResult {
  const seconds = s.micros / 1e6;
  const errors = s.connect + s.read + s.write + s.timeout;
  // wrk counts any status above 399 as a status error; the expected ones are counted apart.
  const expected = expectedStatus === undefined ? 0 : s.expected;
  const unexpected = expectedStatus === undefined ? s.status : s.requests - s.expected;
  const ok = s.requests - s.status;
  const statusCodes: Record<string, number> = {};
  if (ok > 0 && expectedStatus === undefined) statusCodes["2xx"] = ok;
  if (expected) statusCodes[String(expectedStatus)] = expected;
  if (unexpected) statusCodes.other = unexpected;
  const samples = Object.entries({ connect: s.connect, read: s.read, write: s.write, timeout: s.timeout })
    .filter(([, n]) => n > 0)
    .map(([kind, n]) => `${n} ${kind} errors`);
  return {
    requests: s.requests,
    seconds,
    rps: seconds > 0 ? s.requests / seconds : 0,
    p50: s.p50 / 1000,
    p99: s.p99 / 1000,
    errors,
    timeouts: s.timeout,
    unexpected,
    expected,
    statusCodes,
    errorSamples: samples,
  };
}

/** One wrk run: two threads (one per core), `connections` keep-alive connections, whole seconds. */
export async function runWrkLoad(spec: HttpLoadSpec, settings: LoadSettings): Promise<LoadResult> {
  const dir = await tempDir("bench-wrk-");
  try {
    const file = join(dir.path, "load.lua");
    await writeFile(file, script(spec));
    const threads = Math.min(2, settings.connections);
    const args = [
      "-t",
      String(threads),
      "-c",
      String(settings.connections),
      "-d",
      `${Math.max(1, Math.round(settings.duration))}s`,
      "--timeout",
      "10s",
      "-s",
      file,
      spec.url,
    ];
    const output = await new Promise<string>((resolve, reject) => {
      const child = spawn("wrk", args, { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString()));
      child.once("error", reject);
      child.once("exit", (code) =>
        code === 0 ? resolve(out) : reject(new Error(`wrk exited ${code}: ${out.slice(-500)}`)),
      );
    });
    const line = output.split("\n").find((l) => l.startsWith(RESULT_MARK));
    if (!line) throw new Error(`wrk printed no summary: ${output.slice(-500)}`);
    return toResult(JSON.parse(line.slice(RESULT_MARK.length)) as WrkSummary, spec.expectedStatus);
  } finally {
    await dir.remove();
  }
}

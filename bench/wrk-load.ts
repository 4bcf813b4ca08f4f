// HTTP load with `wrk` (Debian package `wrk`), a C load generator in its own process: it takes
// less of the two cores than autocannon in this process, so the service gets more of them.
// Per-request paths are sampled from `next()` into a Lua table the script cycles through.
import { execFileSync, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { tempDir } from "./children.ts";
import type { HttpLoadSpec, HttpPoolSpec, HttpRequestSpec, LoadResult, LoadSettings, PoolLoadResult } from "./types.ts";

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
  lines.push(...summaryLua);
  return lines.join("\n");
}

/**
 * The pool script: each thread reads its share of the requests (every `threads`-th line of
 * `file`, "METHOD PATH") and sends each once; a thread that runs out stops, so no request
 * is sent twice (a second DELETE would be a 404), and says so in the summary.
 */
function poolScript(file: string, threads: number): string {
  return [
    `local mine = {}`,
    `taken = 0`,
    `exhausted = 0`,
    // setup() runs in the main state before each thread's init(): it hands out the shares.
    `local parts = 0`,
    `setup = function(thread) thread:set("part", parts); parts = parts + 1; table.insert(threads, thread) end`,
    `init = function(args)`,
    `  local k = 0`,
    `  for line in io.lines(${lua(file)}) do`,
    `    if k % ${threads} == part then`,
    `      local method, path = line:match("^(%S+) (.+)$")`,
    `      table.insert(mine, wrk.format(method, path))`,
    `    end`,
    `    k = k + 1`,
    `  end`,
    `end`,
    `request = function()`,
    `  if taken < #mine then taken = taken + 1; return mine[taken] end`,
    // stop() ends the thread's loop before this request's answer is read: it is not counted.
    `  if exhausted == 0 then exhausted = 1; wrk.thread:stop() end`,
    `  return wrk.format("GET", "/bench-pool-exhausted")`,
    `end`,
    ...summaryLua,
  ].join("\n");
}

/** Threads are collected in setup(); done() sums their counters into one JSON line. */
const summaryLua = [
  `threads = {}`,
  `setup = setup or function(thread) table.insert(threads, thread) end`,
  `done = function(summary, latency, requests)`,
  `  local expected_total, exhausted_total, taken = 0, 0, {}`,
  `  for _, t in ipairs(threads) do`,
  `    expected_total = expected_total + (t:get("expected") or 0)`,
  `    exhausted_total = exhausted_total + (t:get("exhausted") or 0)`,
  `    table.insert(taken, t:get("taken") or 0)`,
  `  end`,
  `  local e = summary.errors`,
  `  io.write(string.format('${RESULT_MARK}{"requests":%d,"micros":%d,"p50":%d,"p99":%d,"connect":%d,"read":%d,` +
    `"write":%d,"status":%d,"timeout":%d,"expected":%d,"exhausted":%d,"taken":[%s]}\\n',`,
  `    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.connect, e.read, ` +
    `e.write, e.status, e.timeout, expected_total, exhausted_total, table.concat(taken, ",")))`,
  `end`,
];

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
  /** Pool loads: threads that ran out of requests. */
  exhausted: number;
  /** Pool loads: requests each thread took from its share (sent, answered or not). */
  taken: number[];
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

/**
 * One wrk run of `spec`'s requests: two threads (one per core), `connections` keep-alive connections, whole seconds.
 */
export async function runWrkLoad(spec: HttpLoadSpec, settings: LoadSettings): Promise<LoadResult> {
  const summary = await runWrk(spec.url, settings, async () => script(spec));
  return toResult(summary, spec.expectedStatus);
}

/** One wrk run sending each of `spec.requests` at most once (a thread stops when its share runs out). */
export async function runWrkPoolLoad(spec: HttpPoolSpec, settings: LoadSettings): Promise<PoolLoadResult> {
  const summary = await runWrk(spec.url, settings, async (dir, threads) => {
    const file = join(dir, "requests.txt");
    await writeFile(file, spec.requests.map((r) => `${r.method} ${r.path}\n`).join(""));
    return poolScript(file, threads);
  });
  // Thread t took the first taken[t] of the requests i with i % threads === t.
  const threads = summary.taken.length;
  const unsent = spec.requests.filter((_, i) => Math.floor(i / threads) >= (summary.taken[i % threads] ?? 0));
  return { ...toResult(summary, undefined), exhausted: summary.exhausted > 0, unsent };
}

async function runWrk(
  url: string,
  settings: LoadSettings,
  scriptIn: (dir: string, threads: number) => Promise<string>,
): Promise<WrkSummary> {
  const dir = await tempDir("bench-wrk-");
  try {
    const threads = Math.min(2, settings.connections);
    const file = join(dir.path, "load.lua");
    await writeFile(file, await scriptIn(dir.path, threads));
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
      url,
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
    return JSON.parse(line.slice(RESULT_MARK.length)) as WrkSummary;
  } finally {
    await dir.remove();
  }
}

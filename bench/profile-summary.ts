// Summarizes V8 .cpuprofile files (from `npm run bench -- --cpu-prof DIR`): the top
// functions by self time, and self time by package or project file.
// Usage: npx tsx bench/profile-summary.ts DIR/*.cpuprofile [--top N] [--skip S]
import { readFileSync } from "node:fs";
import { relative } from "node:path";
import { root } from "./children.ts";
import { markdownTable } from "./report.ts";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

const meta = new Set(["(idle)", "(program)", "(garbage collector)", "(root)"]);

/** The package (with `file`, its file inside it), a node: module, or a project file. */
function where(url: string, file = false): string {
  if (!url) return "(native)";
  const path = url.replace(/^file:\/\//, "");
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\/(.*)$/.exec(path);
  if (pkg) return file ? `${pkg[1]}/${pkg[2]}` : pkg[1]!;
  if (path.startsWith("node:")) return path;
  return relative(root, path);
}

/**
 * Where a native frame was called from: the nearest caller outside node's internals, so a
 * socket write is charged to the NATS client or to the HTTP code that asked for it.
 */
function nativeCaller(id: number, byId: Map<number, ProfileNode>, parents: Map<number, number>): string {
  for (let up = parents.get(id); up !== undefined; up = parents.get(up)) {
    const { url, functionName } = byId.get(up)!.callFrame;
    if (meta.has(functionName)) break;
    if (url && !url.startsWith("node:")) return where(url);
  }
  return "node";
}

interface SelfTime {
  ms: number;
  fn: string;
  /** File and line (or the native frame's caller). */
  at: string;
  /** The package, node: module or project file it counts toward. */
  place: string;
}

/** Self time per function, leaving out the first `skipMs` (startup). */
function selfTimes(profile: CpuProfile, skipMs: number): SelfTime[] {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parents = new Map(profile.nodes.flatMap((n) => (n.children ?? []).map((child) => [child, n.id] as const)));
  const self = new Map<string, SelfTime>();
  let elapsedMs = 0;
  profile.samples.forEach((id, i) => {
    elapsedMs += profile.timeDeltas[i]! / 1000;
    if (elapsedMs < skipMs) return;
    // A sample's time is the gap to the next one (µs).
    const ms = (profile.timeDeltas[i + 1] ?? 0) / 1000;
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame;
    const fn = functionName || "(anonymous)";
    const native = !url && !meta.has(fn) ? `(native, from ${nativeCaller(id, byId, parents)})` : undefined;
    // Code that tsx compiled reports line 0: leave the line out rather than say 1.
    const at = meta.has(fn) ? "" : (native ?? `${where(url, true)}${lineNumber > 0 ? `:${lineNumber + 1}` : ""}`);
    const key = `${fn} ${at}`;
    const entry = self.get(key) ?? { ms: 0, fn, at, place: meta.has(fn) ? fn : (native ?? where(url)) };
    entry.ms += ms;
    self.set(key, entry);
  });
  return [...self.values()];
}

function summarize(file: string, top: number, skipMs: number): string {
  const profile = JSON.parse(readFileSync(file, "utf8")) as CpuProfile;
  const entries = selfTimes(profile, skipMs);
  const total = entries.reduce((sum, e) => sum + e.ms, 0);
  const idle = entries.find((e) => e.fn === "(idle)")?.ms ?? 0;
  const busy = total - idle;
  const pct = (ms: number) => `${((ms / busy) * 100).toFixed(1)}%`;
  const functions = entries
    .filter((e) => e.fn !== "(idle)")
    .sort((a, b) => b.ms - a.ms)
    .slice(0, top);
  const byPlace = new Map<string, number>();
  for (const e of entries.filter((e) => e.fn !== "(idle)")) {
    byPlace.set(e.place, (byPlace.get(e.place) ?? 0) + e.ms);
  }
  const places = [...byPlace].sort((a, b) => b[1] - a[1]).slice(0, top);
  return [
    `${file}: ${(total / 1000).toFixed(1)} s profiled, ${(busy / 1000).toFixed(1)} s busy ` +
      `(${((busy / total) * 100).toFixed(0)}%); shares below are of busy time`,
    "",
    markdownTable(
      ["function", "where", "self ms", "self %"],
      functions.map((e) => [e.fn, e.at, e.ms.toFixed(0), pct(e.ms)]),
    ),
    "",
    markdownTable(
      ["package / file", "self ms", "self %"],
      places.map(([place, ms]) => [place, ms.toFixed(0), pct(ms)]),
    ),
  ].join("\n");
}

const args = process.argv.slice(2);
/** Takes `--name N` out of args; `fallback` when absent. */
function numberFlag(name: string, fallback: number): number {
  const at = args.indexOf(name);
  return at >= 0 ? Number(args.splice(at, 2)[1]) || fallback : fallback;
}
const top = numberFlag("--top", 10);
const skipSeconds = numberFlag("--skip", 0);
if (args.length === 0) {
  console.error(
    "usage: npx tsx bench/profile-summary.ts FILE.cpuprofile... [--top N] [--skip S (startup seconds to leave out)]",
  );
  process.exitCode = 1;
}
for (const file of args) console.log(`${summarize(file, top, skipSeconds * 1000)}\n`);

// Where a host's instances live on this machine, for each provider: the service's child per
// instance (node for `process`, the outer bwrap for `sandbox`, `runsc run` for `gvisor`) and its
// processes, the isolated providers' cgroups (memory charged, and every pid of the host's tree),
// and the instance processes of a run still alive after it.
import { existsSync, readdirSync } from "node:fs";
import { rmdir, writeFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { GVISOR_MARKER } from "../vm-runtime/host/gvisor-provider.ts";
import { INSTANCE_MARKER } from "../vm-runtime/host/process-provider.ts";
import { SANDBOX_MARKER } from "../vm-runtime/host/sandbox-command.ts";
import { WARM_PREFIX } from "../vm-runtime/host/isolated-boot.ts";
import { cmdlineOf, processesMentioning, readText as read, statFields } from "./proc.ts";
import { pause } from "./stats.ts";

export type ProviderName = "process" | "sandbox" | "gvisor";

/** One instance's processes (host pid namespace). */
export interface InstanceProcs {
  /** The service's child: the node runtime (`process`), the outer bwrap (`sandbox`) or `runsc run` (`gvisor`). */
  readonly root: number;
  /**
   * The process that runs image code: the deepest of the tree (node) for `process` and
   * `sandbox`; for `gvisor` the Sentry (`runsc-sandbox`), as node has no host process there.
   */
  readonly runtime: number;
  /**
   * What the instance costs in processes: root and every descendant; for `gvisor` every pid in
   * its cgroup (`runsc run`, `runsc-gofer`, `runsc-sandbox` and the Sentry's stub processes).
   */
  readonly pids: readonly number[];
  /** The instance's memory cgroup directory (`sandbox` and `gvisor`). */
  readonly memoryCgroup?: string;
}

const CGROUP_ROOT = "/sys/fs/cgroup";
/** The sandbox provider's default parent of host groups (vm-runtime/host/cgroups.ts). */
const CGROUP_PARENT = "typed-service-microvms";

/** Live (non-zombie) pids and their parents, from one /proc scan. */
function processTable(): Map<number, number> {
  const table = new Map<number, number>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const fields = statFields(entry);
    if (!fields.length || fields[0] === "Z" || fields[0] === "X") continue;
    table.set(Number(entry), Number(fields[1]));
  }
  return table;
}

/** What the command line of the service's child for each instance contains. */
export const markerOf = (provider: ProviderName): string =>
  ({ process: INSTANCE_MARKER, sandbox: SANDBOX_MARKER, gvisor: GVISOR_MARKER })[provider];

/** The instances the service `servicePid` runs now, with their process trees. */
export function instancesOf(servicePid: number, provider: ProviderName): InstanceProcs[] {
  const table = processTable();
  const children = new Map<number, number[]>();
  for (const [pid, ppid] of table) children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  const roots = (children.get(servicePid) ?? []).filter((pid) =>
    read(`/proc/${pid}/cmdline`).includes(markerOf(provider)),
  );
  return roots.map((root) => {
    const tree: number[] = [];
    let deepest = root;
    let level = [root];
    while (level.length) {
      tree.push(...level);
      deepest = level[0]!;
      level = level.flatMap((pid) => children.get(pid) ?? []);
    }
    const memoryCgroup = provider === "process" ? undefined : memoryCgroupOf(root);
    if (provider !== "gvisor" || !memoryCgroup) {
      return { root, runtime: deepest, pids: tree, ...(memoryCgroup ? { memoryCgroup } : {}) };
    }
    // runsc re-executes itself into namespaces of its own: the cgroup, not the tree, holds all of it.
    const pids = [...new Set([...tree, ...pidsIn(memoryCgroup)])].filter((pid) => table.has(pid));
    const sentry = pids.find((pid) => read(`/proc/${pid}/cmdline`).split("\0")[0]?.endsWith("runsc-sandbox"));
    return { root, runtime: sentry ?? deepest, pids, memoryCgroup };
  });
}

const pidsIn = (dir: string): number[] =>
  read(join(dir, "cgroup.procs"))
    .split("\n")
    .filter((line) => line.trim())
    .map(Number);

/** The memory cgroup directory of `pid` (v1 `memory` hierarchy, or the v2 unified one). */
export function memoryCgroupOf(pid: number): string | undefined {
  for (const line of read(`/proc/${pid}/cgroup`).split("\n")) {
    const [, controllers, path] = line.split(":");
    if (path === undefined) continue;
    if (controllers!.split(",").includes("memory")) return join(CGROUP_ROOT, "memory", path);
    if (controllers === "" && existsSync(join(CGROUP_ROOT, "cgroup.controllers"))) return join(CGROUP_ROOT, path);
  }
  return undefined;
}

/** What a memory cgroup is charged, KiB: all of it, and its parts (v1 and v2 name them apart). */
export interface CgroupMemory {
  /** Its whole charge (`memory.usage_in_bytes` / `memory.current`): every part below. */
  usage: number;
  /** Anonymous memory: for gVisor, the Go heaps and stacks of runsc, the gofer and the Sentry. */
  anon: number;
  /** Shared memory: for gVisor, the Sentry's memory file (the instance's own memory: node's heap, malloc). */
  shmem: number;
  /** Page cache beyond shmem (files its processes read first, charged to it). */
  file: number;
  /** Kernel memory (page tables, sockets, slab). */
  kernel: number;
}

export function cgroupMemoryKiB(dir: string): CgroupMemory {
  const stat = read(join(dir, "memory.stat"));
  const field = (name: string) => Number(new RegExp(`^${name} (\\d+)$`, "m").exec(stat)?.[1] ?? 0);
  const v1 = existsSync(join(dir, "memory.usage_in_bytes"));
  const usage = Number(read(join(dir, v1 ? "memory.usage_in_bytes" : "memory.current")) || 0);
  const kib = (bytes: number) => Math.round(bytes / 1024);
  // v1 counts anonymous memory as `rss` (per group; `total_rss` with children), page cache with
  // shmem as `cache`, kernel memory apart; v2 as `anon`, `file` (shmem in it) and `kernel`.
  const shmem = v1 ? field("total_shmem") : field("shmem");
  return {
    usage: kib(usage),
    anon: kib(v1 ? field("total_rss") : field("anon")),
    shmem: kib(shmem),
    file: kib((v1 ? field("total_cache") : field("file")) - shmem),
    kernel: kib(v1 ? Number(read(join(dir, "memory.kmem.usage_in_bytes")) || 0) : field("kernel")),
  };
}

/** The key the service names its host cgroup by (vm-runtime/service/provider.ts; keep in step). */
export const hostCgroupKey = (hostId: string) => createHash("sha256").update(hostId).digest("hex").slice(0, 16);

/** The host's group in every hierarchy that has one (v1: one per controller; v2: one). */
function hostCgroupDirs(hostId: string): string[] {
  return hostGroupDirsOfKey(hostCgroupKey(hostId));
}

function hostGroupDirsOfKey(key: string): string[] {
  const dirs = existsSync(join(CGROUP_ROOT, "cgroup.controllers"))
    ? [join(CGROUP_ROOT, CGROUP_PARENT, key)]
    : ["memory", "cpu", "pids", "freezer"].map((controller) => join(CGROUP_ROOT, controller, CGROUP_PARENT, key));
  return dirs.filter((dir) => existsSync(dir));
}

/** Every pid in the host's cgroup tree (instances of a sandbox host, whoever their parent is now). */
export function pidsInHostCgroups(hostId: string): number[] {
  return pidsUnder(hostCgroupDirs(hostId));
}

/**
 * The same for the group the service names by `key` (vm-runtime/service's hostCgroupKey of its
 * work directory), walls booted ahead for the next instance (`warm-…` groups) apart.
 */
export function pidsInHostGroup(key: string): { instances: number[]; warm: number[] } {
  const dirs = hostGroupDirsOfKey(key);
  const groups = dirs.flatMap((dir) => safeDirs(dir).map((name) => ({ name, dir: join(dir, name) })));
  const warm = groups.filter((g) => g.name.startsWith(WARM_PREFIX)).map((g) => g.dir);
  const others = groups.filter((g) => !g.name.startsWith(WARM_PREFIX)).map((g) => g.dir);
  return { instances: pidsUnder(others), warm: pidsUnder(warm) };
}

function pidsUnder(dirs: string[]): number[] {
  const pids = new Set<number>();
  const walk = (dir: string) => {
    for (const line of read(join(dir, "cgroup.procs")).split("\n")) if (line.trim()) pids.add(Number(line));
    for (const entry of safeDirs(dir)) walk(join(dir, entry));
  };
  dirs.forEach(walk);
  return [...pids];
}

/** Thaws every group of the hosts (a SIGKILL waits while its target is frozen). */
export async function thawHostCgroups(hostIds: string[]): Promise<void> {
  const thaw = async (dir: string): Promise<void> => {
    const [file, value] = existsSync(join(dir, "freezer.state")) ? ["freezer.state", "THAWED"] : ["cgroup.freeze", "0"];
    if (existsSync(join(dir, file))) await writeFile(join(dir, file), value).catch(() => undefined);
    for (const entry of safeDirs(dir)) await thaw(join(dir, entry));
  };
  for (const dir of hostIds.flatMap(hostCgroupDirs)) await thaw(dir);
}

/** Removes the hosts' (now empty) groups, deepest first, so runs leave no cgroup behind. */
export async function removeHostCgroups(hostIds: string[]): Promise<void> {
  const remove = async (dir: string): Promise<void> => {
    for (const entry of safeDirs(dir)) await remove(join(dir, entry));
    await rmdir(dir).catch(() => undefined);
  };
  for (const dir of hostIds.flatMap(hostCgroupDirs)) await remove(dir);
}

function safeDirs(dir: string): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name);
  } catch {
    return [];
  }
}

/**
 * Instance processes of this run still alive (there must be none): process-provider instances
 * and runtimes by hand by a directory in their command line, sandbox instances by the cgroup
 * tree of `hostIds` (bwrap's command line names no host directory).
 */
export async function leftoverInstances(
  markers: string[],
  hostIds: string[] = [],
  waitMs = 3_000,
): Promise<{ pid: number; cmdline: string }[]> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const found = processesMentioning(markers);
    const seen = new Set(found.map((p) => p.pid));
    for (const pid of hostIds.flatMap(pidsInHostCgroups)) {
      if (!seen.has(pid) && pid !== process.pid) found.push({ pid, cmdline: cmdlineOf(pid) || "(gone)" });
    }
    if (found.length === 0 || Date.now() > deadline) return found;
    await pause(100);
  }
}

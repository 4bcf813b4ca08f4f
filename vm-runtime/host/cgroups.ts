// Per-instance cgroups for the sandbox provider, v1 (one hierarchy per controller) and v2
// (unified): memory, CPU quota and process-count limits, the CPUs offered (all of the host's),
// the freezer for suspend, and a kill of every process in the group. A host's instances sit
// under one host group of their own, so reconcile finds what an earlier run left
// from the kernel's own lists, never from storage.
import { existsSync, readFileSync, readdirSync, realpathSync } from "node:fs";
import { mkdir, rename, rmdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { pollUntil } from "./provider-util.ts";

/** Limits applied when an instance's group is made. */
export interface CgroupLimits {
  /** Memory cap (RSS plus page cache, including its tmpfs scratch) in bytes. */
  readonly memoryBytes: number;
  /** CPU quota in cores (0.5 = half of one core), of the host's CPUs, all offered. */
  readonly cpus: number;
  /** Largest number of processes and threads. */
  readonly pids: number;
  /** Made at the background CPU weight (`InstanceCgroup.weigh`). */
  readonly background?: boolean;
}

/** One instance's group. */
export interface InstanceCgroup {
  readonly name: string;
  /**
   * Its path from each hierarchy's root, as an OCI `linux.cgroupsPath` (for runsc, which reads
   * its memory limit and CPUs from it); undefined where the group offers no CPU set to read.
   */
  readonly path?: string;
  /** The `cgroup.procs` files a new process writes its pid to (one per v1 hierarchy). */
  readonly procsFiles: readonly string[];
  /** Pids of the processes in the group (host pid namespace). */
  pids(): number[];
  /** Whether `pid` has joined the group in every hierarchy. */
  holds(pid: number): boolean;
  /** Resolves once every process of the group is frozen. */
  freeze(timeoutMs?: number): Promise<void>;
  thaw(): Promise<void>;
  /** SIGKILLs every process (frozen first, so none forks meanwhile); resolves once empty. */
  kill(timeoutMs?: number): Promise<void>;
  /** Processes of the group the OOM killer ended at its memory limit; 0 when unknown. */
  oomKills(): number;
  /** Memory charged to the group now (its tmpfs pages included), in bytes. */
  memoryBytes(): number;
  /** Its memory cap in bytes, and how many CPUs it is offered. */
  limits(): { readonly memoryBytes: number; readonly cpus: number };
  /**
   * Its CPU weight against the host's other instance groups: `background` gets only the CPU
   * they leave (v1 `cpu.shares` 2, v2 `cpu.weight` 1), else the default's (1024, 100).
   */
  weigh(background: boolean): Promise<void>;
  /** Removes the group (it must be empty). */
  remove(): Promise<void>;
}

/** The groups of one host as they are: what a host that is gone left (`existingHostCgroups`). */
export interface HostGroups {
  readonly version: 1 | 2;
  /** The instance groups that exist now (e.g. left by an earlier run of this host). */
  existing(): InstanceCgroup[];
  /** Removes the host's own group once it holds no instance group (best effort). */
  remove(): Promise<void>;
}

/** The groups of one host. */
export interface HostCgroups extends HostGroups {
  /** Makes an instance group with `limits`. */
  create(name: string, limits: CgroupLimits): Promise<InstanceCgroup>;
  /** Renames a group, its processes staying in it (a warm wall named after its instance). */
  rename(group: InstanceCgroup, name: string): Promise<InstanceCgroup>;
}

const ROOT = "/sys/fs/cgroup";
/** Where host groups go in each hierarchy by default. */
export const DEFAULT_CGROUP_PARENT = "typed-service-microvms";
/** The v1 hierarchies an instance group has a directory in. */
export const V1_CONTROLLERS = ["memory", "cpu", "pids", "freezer"] as const;
/**
 * Further v1 hierarchies it has a directory in where they are mounted: cpuset (the CPUs it is
 * offered) and the rest of runsc's own list, so that runsc, given the group, finds every
 * directory made and makes none of its own (which a host killed would leave behind).
 */
const V1_OPTIONAL = [
  "cpuset",
  "cpuacct",
  "blkio",
  "devices",
  "hugetlb",
  "net_cls",
  "net_prio",
  "perf_event",
  "rdma",
  "systemd",
] as const;
const CPU_PERIOD_US = 100_000;
/** CPU weights of a group in the background and of the others: each version's least and default. */
export const CPU_SHARES = { background: 2, normal: 1024 } as const;
export const CPU_WEIGHT = { background: 1, normal: 100 } as const;
const weightOf = (table: typeof CPU_SHARES | typeof CPU_WEIGHT, background: boolean) =>
  String(background ? table.background : table.normal);
/** How long a group's kill waits, by default, for its processes to end. */
export const CGROUP_KILL_TIMEOUT_MS = 5_000;

/** Which cgroup layout this machine has: v2 when unified, v1 when every controller we use is mounted. */
export function cgroupVersion(root = ROOT): 1 | 2 | undefined {
  if (existsSync(join(root, "cgroup.controllers"))) return 2;
  if (V1_CONTROLLERS.every((controller) => existsSync(join(root, controller, "cgroup.procs")))) return 1;
  return undefined;
}

/**
 * The v1 hierarchies mounted here that groups have a directory in: `V1_CONTROLLERS` first,
 * then the mounted ones of `V1_OPTIONAL`, each hierarchy once (`cpuacct` is often `cpu`'s).
 */
export function v1Hierarchies(root = ROOT): string[] {
  const seen = new Set<string>();
  return [...V1_CONTROLLERS, ...V1_OPTIONAL].filter((name) => {
    const dir = join(root, name);
    if (!existsSync(join(dir, "cgroup.procs"))) return false;
    const real = realpathSync(dir);
    if (seen.has(real)) return false;
    seen.add(real);
    return true;
  });
}

/** What all of one host's instances may use together. */
export interface HostLimits {
  readonly cpus: number;
  readonly memoryBytes: number;
  /** Relative to each hierarchy's root (default `typed-service-microvms`). */
  readonly parent?: string;
}

/**
 * Opens (creating as needed) the host's group `<parent>/<hostKey>` in every hierarchy, with a
 * CPU quota and a memory cap for all its instances together.
 */
export async function openHostCgroups(hostKey: string, limits: HostLimits, root = ROOT): Promise<HostCgroups> {
  const version = cgroupVersion(root);
  if (version === undefined) throw new Error(`no usable cgroup hierarchy under ${root}`);
  const parent = limits.parent ?? DEFAULT_CGROUP_PARENT;
  checkNames(hostKey, parent);
  return version === 2 ? openV2(root, join(parent, hostKey), limits) : openV1(root, join(parent, hostKey), limits);
}

/**
 * The groups `openHostCgroups` made for `hostKey` under `parent`, as they are (nothing is made
 * or limited): undefined when there are none. For reclaiming what a host that is gone left.
 */
export async function existingHostCgroups(
  hostKey: string,
  parent = DEFAULT_CGROUP_PARENT,
  root = ROOT,
): Promise<HostGroups | undefined> {
  const version = cgroupVersion(root);
  if (version === undefined) return undefined;
  checkNames(hostKey, parent);
  if (version === 2) {
    const hostDir = join(root, parent, hostKey);
    return existsSync(hostDir) ? openV2(root, join(parent, hostKey)) : undefined;
  }
  const hostPath = join(parent, hostKey);
  const exists = v1Hierarchies(root).some((hierarchy) => existsSync(join(root, hierarchy, hostPath)));
  return exists ? openV1(root, hostPath) : undefined;
}

/** A host key is one name; a parent is names joined by `/` (never `.` or `..`). */
function checkNames(hostKey: string, parent: string): void {
  const name = /^(?!\.\.?$)[A-Za-z0-9._-]+$/;
  if (!name.test(hostKey)) throw new Error(`unusable cgroup name ${JSON.stringify(hostKey)}`);
  if (!parent.split("/").every((part) => name.test(part)))
    throw new Error(`unusable cgroup parent ${JSON.stringify(parent)}`);
}

const quotaUs = (cpus: number) => Math.max(1_000, Math.round(cpus * CPU_PERIOD_US));

/** The CPUs of a cpuset list (`0-2,7`). */
export function parseCpuList(text: string): number[] {
  return text
    .trim()
    .split(",")
    .filter(Boolean)
    .flatMap((part) => {
      const [first, last = first] = part.split("-").map(Number) as [number, number?];
      return Array.from({ length: last! - first + 1 }, (_, i) => first + i);
    });
}

/** The host group of `hostPath` in every hierarchy, made and limited first unless `limits` is undefined. */
async function openV1(root: string, hostPath: string, limits?: HostLimits): Promise<HostCgroups> {
  const hierarchies = v1Hierarchies(root);
  const dirs = (name: string) => hierarchies.map((hierarchy) => join(root, hierarchy, hostPath, name));
  const cpuset = hierarchies.includes("cpuset") ? join(root, "cpuset", hostPath) : undefined;
  if (limits) {
    await Promise.all(hierarchies.map((hierarchy) => mkdir(join(root, hierarchy, hostPath), { recursive: true })));
    // A v1 cpuset group starts with no CPUs and no memory nodes: each level takes its parent's.
    if (cpuset) await inheritCpuset(join(root, "cpuset"), hostPath);
    await writeFile(join(root, "cpu", hostPath, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
    await writeFile(join(root, "cpu", hostPath, "cpu.cfs_quota_us"), String(quotaUs(limits.cpus)));
    // A v1 parent's limit covers its children only with use_hierarchy (always on since Linux 5.x; set where it is not).
    await writeFile(join(root, "memory", hostPath, "memory.use_hierarchy"), "1").catch(() => undefined);
    await writeFile(join(root, "memory", hostPath, "memory.limit_in_bytes"), String(limits.memoryBytes));
  }
  const group = (name: string): InstanceCgroup => {
    const all = dirs(name);
    const [memory, cpu, , freezer] = all as [string, string, string, string];
    return {
      name,
      ...(cpuset ? { path: `/${join(hostPath, name)}` } : {}),
      procsFiles: all.map((dir) => join(dir, "cgroup.procs")),
      pids: () => unionPids(all),
      holds: (pid) => all.every((dir) => unionPids([dir]).includes(pid)),
      async freeze(timeoutMs = 2_000) {
        await writeFile(join(freezer, "freezer.state"), "FROZEN");
        const frozen = await pollUntil(() => readText(join(freezer, "freezer.state")) === "FROZEN", timeoutMs);
        if (!frozen) throw new Error(`cgroup ${name} did not freeze`);
      },
      thaw: () => writeFile(join(freezer, "freezer.state"), "THAWED"),
      kill(timeoutMs) {
        return killMembers(this, timeoutMs);
      },
      oomKills: () => counter(readText(join(memory, "memory.oom_control")), "oom_kill"),
      memoryBytes: () => Number(readText(join(memory, "memory.usage_in_bytes")) ?? 0),
      limits: () => ({
        memoryBytes: Number(readText(join(memory, "memory.limit_in_bytes"))),
        cpus: cpuset ? parseCpuList(readText(join(cpuset, name, "cpuset.cpus")) ?? "").length : 0,
      }),
      weigh: (background) => writeFile(join(cpu, "cpu.shares"), weightOf(CPU_SHARES, background)),
      async remove() {
        // Every hierarchy's, even when one of them refuses.
        const failed = (await Promise.allSettled(all.map((dir) => rmdir(dir).catch(ignoreMissing)))).find(
          (outcome) => outcome.status === "rejected",
        );
        if (failed) throw failed.reason;
      },
    };
  };
  return {
    version: 1,
    async create(name, limits) {
      await Promise.all(dirs(name).map((dir) => mkdir(dir, { recursive: true })));
      const [memory, cpu, pids] = dirs(name) as [string, string, string];
      // A v1 cpuset group starts with no CPUs: it gets all of the host group's (its quota bounds
      // its time; pinned to fewer, a starved instance could not move to an idler CPU).
      if (cpuset) {
        await writeFile(join(cpuset, name, "cpuset.cpus"), readText(join(cpuset, "cpuset.cpus")) ?? "0");
        await writeFile(join(cpuset, name, "cpuset.mems"), readText(join(cpuset, "cpuset.mems")) ?? "0");
      }
      await writeFile(join(memory, "memory.limit_in_bytes"), String(limits.memoryBytes));
      // Swap would let an instance exceed its cap on disk; absent when swap accounting is off.
      await writeFile(join(memory, "memory.memsw.limit_in_bytes"), String(limits.memoryBytes)).catch(() => undefined);
      await writeFile(join(cpu, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
      await writeFile(join(cpu, "cpu.cfs_quota_us"), String(quotaUs(limits.cpus)));
      if (limits.background) await writeFile(join(cpu, "cpu.shares"), weightOf(CPU_SHARES, true));
      await writeFile(join(pids, "pids.max"), String(limits.pids));
      return group(name);
    },
    // Every hierarchy's: a group whose making stopped half way is in some of them only.
    existing: () =>
      [...new Set(hierarchies.flatMap((hierarchy) => subdirectories(join(root, hierarchy, hostPath))))].map(group),
    async rename(from, name) {
      const [sources, targets] = [dirs(from.name), dirs(name)];
      let renamed = 0;
      try {
        for (; renamed < sources.length; renamed++) await rename(sources[renamed]!, targets[renamed]!);
      } catch (err) {
        // All of its hierarchies under one name: those already renamed go back.
        for (let i = 0; i < renamed; i++) await rename(targets[i]!, sources[i]!).catch(() => undefined);
        throw err;
      }
      return group(name);
    },
    async remove() {
      for (const hierarchy of hierarchies) await rmdir(join(root, hierarchy, hostPath)).catch(() => undefined);
    },
  };
}

/** The host group of `hostPath`, made and limited first unless `limits` is undefined. */
async function openV2(root: string, hostPath: string, limits?: HostLimits): Promise<HostCgroups> {
  const hostDir = join(root, hostPath);
  const parentDir = dirname(hostDir);
  if (limits) {
    await mkdir(hostDir, { recursive: true });
    // Children get the controllers only when every ancestor delegates them.
    for (const dir of [parentDir, hostDir]) {
      await writeFile(join(dir, "cgroup.subtree_control"), "+memory +cpu +pids");
      // The CPUs offered, where the machine delegates cpuset.
      await writeFile(join(dir, "cgroup.subtree_control"), "+cpuset").catch(() => undefined);
    }
    await writeFile(join(hostDir, "cpu.max"), `${quotaUs(limits.cpus)} ${CPU_PERIOD_US}`);
    await writeFile(join(hostDir, "memory.max"), String(limits.memoryBytes));
  }
  const group = (name: string): InstanceCgroup => {
    const dir = join(hostDir, name);
    const cpuset = existsSync(join(dir, "cpuset.cpus.effective"));
    return {
      name,
      ...(cpuset ? { path: `/${join(hostPath, name)}` } : {}),
      procsFiles: [join(dir, "cgroup.procs")],
      pids: () => unionPids([dir]),
      holds: (pid) => unionPids([dir]).includes(pid),
      async freeze(timeoutMs = 2_000) {
        await writeFile(join(dir, "cgroup.freeze"), "1");
        const frozen = await pollUntil(() => /^frozen 1$/m.test(readText(join(dir, "cgroup.events")) ?? ""), timeoutMs);
        if (!frozen) throw new Error(`cgroup ${name} did not freeze`);
      },
      thaw: () => writeFile(join(dir, "cgroup.freeze"), "0"),
      async kill(timeoutMs = CGROUP_KILL_TIMEOUT_MS) {
        if (existsSync(join(dir, "cgroup.kill"))) {
          await writeFile(join(dir, "cgroup.kill"), "1");
          if (!(await pollUntil(() => unionPids([dir]).length === 0, timeoutMs)))
            throw new Error(`cgroup ${name} still has processes`);
          return;
        }
        await killMembers(this, timeoutMs);
      },
      oomKills: () => counter(readText(join(dir, "memory.events")), "oom_kill"),
      memoryBytes: () => Number(readText(join(dir, "memory.current")) ?? 0),
      limits: () => ({
        memoryBytes: Number(readText(join(dir, "memory.max"))),
        cpus: parseCpuList(readText(join(dir, "cpuset.cpus.effective")) ?? "").length,
      }),
      weigh: (background) => writeFile(join(dir, "cpu.weight"), weightOf(CPU_WEIGHT, background)),
      remove: () => rmdir(dir).catch(ignoreMissing),
    };
  };
  return {
    version: 2,
    async create(name, limits) {
      const dir = join(hostDir, name);
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, "memory.max"), String(limits.memoryBytes));
      await writeFile(join(dir, "memory.swap.max"), "0").catch(() => undefined);
      await writeFile(join(dir, "cpu.max"), `${quotaUs(limits.cpus)} ${CPU_PERIOD_US}`);
      if (limits.background) await writeFile(join(dir, "cpu.weight"), weightOf(CPU_WEIGHT, true));
      await writeFile(join(dir, "pids.max"), String(limits.pids));
      return group(name);
    },
    existing: () => subdirectories(hostDir).map(group),
    async rename(from, name) {
      await rename(join(hostDir, from.name), join(hostDir, name));
      return group(name);
    },
    remove: () => rmdir(hostDir).catch(() => undefined),
  };
}

/** Gives each level of `path` under a v1 cpuset root its parent's CPUs and memory nodes where it has none. */
async function inheritCpuset(cpusetRoot: string, path: string): Promise<void> {
  let parent = cpusetRoot;
  for (const part of path.split("/")) {
    const dir = join(parent, part);
    for (const file of ["cpuset.cpus", "cpuset.mems"]) {
      if (!readText(join(dir, file))) await writeFile(join(dir, file), readText(join(parent, file)) ?? "");
    }
    parent = dir;
  }
}

/** Freeze, SIGKILL every member (the kernel's list, never a stored pid), thaw, wait until empty. */
async function killMembers(group: InstanceCgroup, timeoutMs = CGROUP_KILL_TIMEOUT_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (group.pids().length > 0) {
    if (Date.now() > deadline) throw new Error(`cgroup ${group.name} still has processes`);
    await group.freeze().catch(() => undefined);
    for (const pid of group.pids()) {
      if (pid <= 1 || pid === process.pid) continue;
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Exited meanwhile.
      }
    }
    await group.thaw().catch(() => undefined);
    await pollUntil(() => group.pids().length === 0, 200);
  }
}

/** The number after `name` on its own line of a flat-keyed cgroup file; 0 when absent. */
function counter(text: string | undefined, name: string): number {
  return Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text ?? "")?.[1] ?? 0);
}

function unionPids(dirs: readonly string[]): number[] {
  const pids = new Set<number>();
  for (const dir of dirs) {
    for (const line of (readText(join(dir, "cgroup.procs")) ?? "").split("\n")) {
      const pid = Number(line);
      if (Number.isInteger(pid) && pid > 0) pids.add(pid);
    }
  }
  return [...pids];
}

function subdirectories(dir: string): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
      .filter((entry) => entry.isDirectory())
      .map((entry) => entry.name);
  } catch {
    return [];
  }
}

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8").trim();
  } catch {
    return undefined;
  }
}

function ignoreMissing(error: NodeJS.ErrnoException): void {
  if (error.code !== "ENOENT") throw error;
}

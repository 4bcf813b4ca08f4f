// What an idle gVisor instance costs, from figures page cache freed elsewhere cannot move: each
// idle instance's cgroup charge with its parts (the Sentry's memory file, runsc's processes, the
// kernel's, page cache it read first), any process of it outside its cgroup, and the service's
// own growth per instance; the machine's used memory (MemTotal - MemAvailable) beside them as
// information only; and how many idle instances a host's caps and this machine's memory hold.
// Beside the memory, the CPU an idle instance keeps using, and how many idle instances that
// alone lets this machine's cores hold.
import { availableParallelism, totalmem } from "node:os";
import { basename } from "node:path";
import { readConfig } from "../config.ts";
import { WARM_PREFIX } from "../vm-runtime/host/isolated-boot.ts";
import { pssKiB, usedKiB } from "./gvisor-parts.ts";
import { cgroupMemoryKiB, memoryCgroupOf, type InstanceProcs } from "./microvm-instance-procs.ts";
import { cpuSeconds } from "./proc.ts";
import { median } from "./stats.ts";

const MiB = 1024 * 1024;

/** Medians over the idle instances, MiB each. */
export interface CgroupParts {
  /** The whole charge: the parts below. */
  charge: number;
  /** The Sentry's memory file (shmem): node's heap, malloc, stacks inside. */
  memoryFile: number;
  /** Anonymous memory of `runsc run`, the gofer and the Sentry (Go). */
  runsc: number;
  kernel: number;
  pageCache: number;
}

export interface IdleMemory {
  instances: number;
  /** MiB per idle instance: the median charge, plus its processes outside its cgroup and the service's growth. */
  perInstanceMiB: number;
  cgroup: CgroupParts;
  /** Processes of the instances outside their cgroup, in all, and their PSS per instance (MiB). */
  outside: { processes: number; MiB: number };
  /** The service's PSS growth per instance, MiB (0 where it shrank). */
  serviceMiB: number;
  /** Information only: MemTotal - MemAvailable, after less before, per instance (page cache moves it). */
  machineMiB: number;
  capacity: Capacity;
}

/** CPU the idle instances used over a span: medians per instance, ms of CPU per second. */
export interface IdleCpu {
  spanMs: number;
  /** Every process of the instance (its cgroup's pids). */
  perInstance: number;
  /** Of it, the Sentry (`runsc-sandbox`): the image's node inside and gVisor's own work. */
  sentry: number;
  /** The machine's cores, and how many idle instances would use them all. */
  cores: number;
  fillsCores: number;
}

/** Idle instances held at `perInstanceMiB`: by one host with its default caps, by the machine with them raised. */
export interface Capacity {
  maxInstances: number;
  totalMemoryMiB: number;
  /** One host, default MICROVM_MAX_INSTANCES and MICROVM_TOTAL_MEMORY_MIB (its cap bounds the cgroups' charges). */
  host: number;
  machineMiB: number;
  /** The whole machine's memory, both caps raised. */
  machine: number;
}

/** What the service and the machine hold before a set of idle instances is launched. */
export interface MemoryBaseline {
  machineKiB: number;
  serviceKiB: number;
}

export const memoryBaseline = (servicePid: number): MemoryBaseline => ({
  machineKiB: usedKiB(),
  serviceKiB: pssKiB(servicePid),
});

/** Walls booted ahead (`warm-…` groups), apart from instances. */
export const isWarmWall = (procs: InstanceProcs) =>
  procs.memoryCgroup !== undefined && basename(procs.memoryCgroup).startsWith(WARM_PREFIX);

/** Reads the idle instances (walls booted ahead left out) against `baseline`. */
export function readIdleMemory(all: InstanceProcs[], servicePid: number, baseline: MemoryBaseline): IdleMemory {
  const machineKiB = usedKiB();
  const instances = all.filter((procs) => procs.memoryCgroup && !isWarmWall(procs));
  const charges = instances.map((procs) => cgroupMemoryKiB(procs.memoryCgroup!));
  const mib = (kib: number[]) => +(median(kib) / 1024).toFixed(1);
  const cgroup: CgroupParts = {
    charge: mib(charges.map((c) => c.usage)),
    memoryFile: mib(charges.map((c) => c.shmem)),
    runsc: mib(charges.map((c) => c.anon)),
    kernel: mib(charges.map((c) => c.kernel)),
    pageCache: mib(charges.map((c) => c.file)),
  };
  const outsiders = instances.flatMap((procs) =>
    procs.pids.filter((pid) => memoryCgroupOf(pid) !== undefined && memoryCgroupOf(pid) !== procs.memoryCgroup),
  );
  const n = Math.max(1, instances.length);
  const outside = {
    processes: outsiders.length,
    MiB: +(outsiders.reduce((sum, pid) => sum + pssKiB(pid), 0) / 1024 / n).toFixed(1),
  };
  const serviceMiB = +(Math.max(0, pssKiB(servicePid) - baseline.serviceKiB) / 1024 / n).toFixed(1);
  const perInstanceMiB = +(cgroup.charge + outside.MiB + serviceMiB).toFixed(1);
  return {
    instances: instances.length,
    perInstanceMiB,
    cgroup,
    outside,
    serviceMiB,
    machineMiB: +((machineKiB - baseline.machineKiB) / 1024 / n).toFixed(1),
    capacity: capacity(perInstanceMiB, cgroup.charge),
  };
}

function capacity(perInstanceMiB: number, chargeMiB: number): Capacity {
  const { maxInstances } = readConfig({}).microvmHost;
  // The provider's default cap of a host's instances together: half the machine's memory.
  const totalMemoryMiB = Math.floor(totalmem() / MiB / 2);
  const machineMiB = Math.floor(totalmem() / MiB);
  return {
    maxInstances,
    totalMemoryMiB,
    host: Math.min(maxInstances, Math.floor(totalMemoryMiB / chargeMiB)),
    machineMiB,
    machine: Math.floor(machineMiB / perInstanceMiB),
  };
}

/** The idle instances' CPU (walls booted ahead left out) over `spanMs` from now. */
export async function readIdleCpu(all: InstanceProcs[], spanMs: number): Promise<IdleCpu> {
  const instances = all.filter((procs) => procs.memoryCgroup && !isWarmWall(procs));
  const read = () =>
    instances.map((procs) => ({
      all: procs.pids.reduce((sum, pid) => sum + cpuSeconds(pid), 0),
      sentry: cpuSeconds(procs.runtime),
    }));
  const before = read();
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, spanMs));
  const after = read();
  const span = (performance.now() - started) / 1000;
  const msPerS = (pick: (x: { all: number; sentry: number }) => number) =>
    +median(after.map((x, i) => ((pick(x) - pick(before[i]!)) * 1000) / span)).toFixed(1);
  const perInstance = msPerS((x) => x.all);
  const cores = availableParallelism();
  return {
    spanMs,
    perInstance,
    sentry: msPerS((x) => x.sentry),
    cores,
    fillsCores: perInstance > 0 ? Math.floor((cores * 1000) / perInstance) : Number.POSITIVE_INFINITY,
  };
}

/** The walls booted ahead now: how many, and their cgroups' charge in all (MiB). */
export function warmWallsMiB(all: InstanceProcs[]): { walls: number; MiB: number } {
  const walls = all.filter(isWarmWall);
  const kib = walls.reduce((sum, procs) => sum + cgroupMemoryKiB(procs.memoryCgroup!).usage, 0);
  return { walls: walls.length, MiB: +(kib / 1024).toFixed(1) };
}

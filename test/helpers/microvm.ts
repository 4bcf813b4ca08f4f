// MicroVM test service: a private NATS, one or more microVM hosts in the test process, the
// microVM API gateway on port 0, and typed clients over both transports. Plus the checks
// every microVM test file ends with (no instance process left).
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KV } from "@nats-io/kv";
import {
  hostCgroupKey,
  provisionMicrovmStores,
  startMicrovmHost,
  type MicrovmHost,
  type MicrovmHostOptions,
} from "../../vm-runtime/service/index.ts";
import { httpClient, natsClient, type Client } from "../../client/index.ts";
import { createGateways, type GatewayOptions } from "../../gateway/index.ts";
import { connectNats, openBuckets, provisionBuckets, type NatsHandle } from "../../platform/index.ts";
import { microvmApi } from "../../schemas/index.ts";
import { childProcessesWith, readProcStat } from "../../vm-runtime/host/proc.ts";
import { INSTANCE_MARKER } from "../../vm-runtime/host/process-provider.ts";
import { SANDBOX_MARKER } from "../../vm-runtime/host/sandbox-command.ts";
import { GVISOR_MARKER } from "../../vm-runtime/host/gvisor-provider.ts";
import { v1Hierarchies } from "../../vm-runtime/host/cgroups.ts";
import { WARM_PREFIX } from "../../vm-runtime/host/isolated-boot.ts";
import type { MicrovmState } from "../../schemas/index.ts";
import { pollUntil } from "../../vm-runtime/host/provider-util.ts";
import { DEFAULT_TIMEOUTS } from "../../vm-runtime/lifecycle/types.ts";
import { rmdirOnceEmpty } from "./cgroup-dirs.ts";
import type { Defer } from "./defer.ts";
import { testNats, type TestNats } from "./nats.ts";

export type MicrovmClient = Client<typeof microvmApi>;

export interface MicrovmService {
  nats: TestNats;
  /** The test's own connection (user `admin`), to set up and inspect. */
  handle: NatsHandle;
  /** The gateways' connection (user `gateway`), to inspect what they hold. */
  gatewayHandle: NatsHandle;
  /** The `microvms` bucket, opened by the test's connection. */
  kv: KV;
  host: MicrovmHost;
  dataDir: string;
  /** The gateway beside the first host, as in one `npm start` process: calls to objects active there skip NATS. */
  microvmUrl: string;
  overNats: MicrovmClient;
  overHttp: MicrovmClient;
  /** Starts one more host on the same NATS (its own connection and data dir). */
  addHost(options?: Partial<MicrovmHostOptions>): Promise<{ host: MicrovmHost; handle: NatsHandle }>;
  /** Starts one more microVM API gateway (on port 0, every request over NATS) with these options; resolves with its URL. */
  addGateway(options: Pick<GatewayOptions, "requestTimeoutMs">): Promise<string>;
}

export const policy = (
  overrides: Partial<{
    maxIdleDurationSeconds: number;
    suspendedDurationSeconds: number;
    autoResumeEnabled: boolean;
  }> = {},
) => ({
  maxIdleDurationSeconds: 600,
  suspendedDurationSeconds: 600,
  autoResumeEnabled: true,
  ...overrides,
});

export async function startMicrovmService(
  defer: Defer,
  options: Partial<MicrovmHostOptions> = {},
  gatewayOptions: Pick<GatewayOptions, "apiKeys" | "microvmHostNames"> = {},
): Promise<MicrovmService> {
  const nats = await testNats(defer);
  const admin = await connectNats({ ...nats.login("admin"), name: "test" });
  defer(() => admin.close());
  // The hosts open their stores as they are: made first, with the limits the test asks for.
  await provisionMicrovmStores(admin.nc, options);
  const addHost = async (hostOptions: Partial<MicrovmHostOptions> = {}) => {
    const handle = await connectNats({ ...nats.login("microvms"), name: "test-microvm-host" });
    defer(() => handle.close());
    const { microvms } = await openBuckets(handle.nc, { only: ["microvms"] });
    const dataDir = await mkdtemp(join(tmpdir(), "microvm-host-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const host = await startMicrovmHost(handle.nc, { kv: microvms, dataDir, ...hostOptions });
    await handle.nc.flush(); // its queue subscriptions are known to the server before any request
    defer(() => host.close());
    return { host, handle, dataDir, kv: microvms };
  };
  const first = await addHost(options);
  const { microvms } = await provisionBuckets(admin.nc, { only: ["microvms"] });
  const gatewayNats = await connectNats({ ...nats.login("gateway"), name: "test:gateway" });
  defer(() => gatewayNats.close());
  const internal = await connectNats({ ...nats.login("internal"), name: "test:internal" });
  defer(() => internal.close());
  const addGateway = async (options: Omit<GatewayOptions, "nats">) => {
    const gateway = createGateways({ nats: gatewayNats, ...options }).microvm;
    const port = await gateway.listen(0, "127.0.0.1");
    defer(() => gateway.close());
    return `http://127.0.0.1:${port}`;
  };
  const microvmUrl = await addGateway({ ...gatewayOptions, inProcess: first.host.inProcess });
  return {
    nats,
    handle: admin,
    gatewayHandle: gatewayNats,
    kv: microvms,
    host: first.host,
    dataDir: first.dataDir,
    microvmUrl,
    overNats: natsClient(microvmApi, internal.nc),
    overHttp: httpClient(microvmApi, microvmUrl),
    addHost: async (hostOptions) => {
      const { host, handle } = await addHost(hostOptions);
      return { host, handle };
    },
    addGateway: (options) => addGateway({ ...gatewayOptions, ...options }),
  };
}

/**
 * The longest an instance stays in a transient state: every one has a lifecycle deadline (a
 * start's is the longest, 30 s) after which it is FAILED. A wait past it would wait for nothing.
 */
const SETTLED_WITHIN_MS = DEFAULT_TIMEOUTS.startMs + 5_000;

/** Polls GetMicrovm until the state is one of `states`; fails the test once it settled in another, or after `timeoutMs`. */
export async function waitForState(
  client: MicrovmClient,
  microvmId: string,
  states: readonly MicrovmState[],
  timeoutMs = SETTLED_WITHIN_MS,
) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const vm = await client.getMicrovm({ microvmIdentifier: microvmId });
    if (states.includes(vm.state as MicrovmState)) return vm;
    const settled = vm.state === "FAILED" || vm.state === "TERMINATED";
    if (settled || Date.now() > deadline)
      assert.fail(`${microvmId} is ${vm.state} (${vm.stateReason ?? ""}), expected ${states.join("|")}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Instance processes started by this test process (the in-process hosts' children), any
 * provider; with `instancesOnly`, not the walls booted ahead that no instance has yet.
 */
export function instanceChildren(options: { instancesOnly?: boolean } = {}): number[] {
  const all = [INSTANCE_MARKER, SANDBOX_MARKER, GVISOR_MARKER].flatMap((marker) =>
    childProcessesWith(process.pid, marker),
  );
  return options.instancesOnly ? all.filter((pid) => !inWarmWall(pid)) : all;
}

/** Whether `pid` is in a cgroup of a wall booted ahead (named WARM_PREFIX…). */
function inWarmWall(pid: number): boolean {
  const groups = readText(`/proc/${pid}/cgroup`) ?? "";
  return groups.split("\n").some((line) => line.split("/").at(-1)?.startsWith(WARM_PREFIX));
}

/** The file's last check: every instance process of this test process is gone. */
export async function assertNoInstanceLeft(): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (instanceChildren().length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(instanceChildren(), [], "an instance process was left running");
}

/** One-letter process state from /proc ('T' stopped), or undefined when gone. */
export const processState = (pid: number) => readProcStat(pid)?.state;

/** True while the process is suspended: stopped (process provider) or in a frozen cgroup (sandbox). */
export function isSuspended(pid: number): boolean {
  if (processState(pid) === "T") return true;
  let groups: string;
  try {
    groups = readFileSync(`/proc/${pid}/cgroup`, "utf8");
  } catch {
    return false;
  }
  const v1 = /^\d+:freezer:(.*)$/m.exec(groups)?.[1];
  if (v1 !== undefined) return readText(`/sys/fs/cgroup/freezer${v1}/freezer.state`) === "FROZEN";
  const v2 = /^0::(.*)$/m.exec(groups)?.[1];
  return v2 !== undefined && /^frozen 1$/m.test(readText(`/sys/fs/cgroup${v2}/cgroup.events`) ?? "");
}

/**
 * Suspended as its host suspends it: a frozen process (the freezer), or gone once the record
 * names the snapshot it was checkpointed into (gVisor with snapshots).
 */
export function isSuspendedOrSaved(pid: number, record: { readonly checkpoint?: unknown } | undefined): boolean {
  return record?.checkpoint ? isGone(pid) : isSuspended(pid);
}

/**
 * Pids left in the instance cgroups of the host whose work directory is `workDir` (the kernel's
 * list; with `instancesOnly`, not those of walls booted ahead); undefined when the host's group
 * does not exist (a running host always has it; a closed one removes it).
 */
export function hostCgroupPids(workDir: string, options: CgroupPidsOptions = {}): number[] | undefined {
  return cgroupPidsOfHostKey(hostCgroupKey(workDir), options);
}

export interface CgroupPidsOptions {
  /** Not those of walls booted ahead. */
  readonly instancesOnly?: boolean;
  /** Only those of this instance's groups (named `<microvmId>-<hex>`). */
  readonly microvmId?: string;
}

const cgroupV2 = () => existsSync("/sys/fs/cgroup/cgroup.controllers");
const hostCgroupDir = (root: string, hostKey: string) => join(root, "typed-service-microvms", hostKey);

/** The same for a provider created with this `hostKey` itself (not a service's work directory). */
export function cgroupPidsOfHostKey(hostKey: string, options: CgroupPidsOptions = {}): number[] | undefined {
  const hostDir = hostCgroupDir(cgroupV2() ? "/sys/fs/cgroup" : "/sys/fs/cgroup/freezer", hostKey);
  const pids: number[] = [];
  if (!existsSync(hostDir)) return undefined;
  for (const group of readdirSync(hostDir, { withFileTypes: true })) {
    if (!group.isDirectory()) continue;
    // Walls booted ahead for the next instance (WARM_PREFIX) until one is assigned.
    if (options.instancesOnly && group.name.startsWith(WARM_PREFIX)) continue;
    if (options.microvmId !== undefined && !group.name.startsWith(`${options.microvmId}-`)) continue;
    const text = readText(join(hostDir, group.name, "cgroup.procs")) ?? "";
    pids.push(
      ...text
        .split("\n")
        .filter(Boolean)
        .map(Number)
        .filter((pid) => !isGone(pid)),
    );
  }
  return pids;
}

/**
 * A file of the host group of a provider created with `hostKey`, or of its group `group`, in `controller`'s hierarchy.
 */
function groupFile(controller: "cpu" | "memory", hostKey: string, group: string | undefined, file: string): string {
  const root = cgroupV2() ? "/sys/fs/cgroup" : `/sys/fs/cgroup/${controller}`;
  return join(hostCgroupDir(root, hostKey), group ?? "", file);
}

/** A flat-keyed counter (`name value` lines) of a cgroup file; fails the test when the file is missing. */
function counterOf(path: string, name: string): number {
  const text = readText(path);
  assert.ok(text !== undefined, `no cgroup file ${path}`);
  return Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
}

/**
 * The CPU quota periods the kernel has counted for the host group of `hostKey` or its group
 * `group`, and those in which the group was throttled. Periods are counted only while the group
 * has a quota and something to run: a group without a quota has none.
 */
export function cpuPeriods(hostKey: string, group?: string): { periods: number; throttled: number } {
  const path = groupFile("cpu", hostKey, group, "cpu.stat");
  return { periods: counterOf(path, "nr_periods"), throttled: counterOf(path, "nr_throttled") };
}

/**
 * The CPU weight of group `group` of the host of `hostKey` (v1 `cpu.shares`, v2 `cpu.weight`) and
 * the pids its CPU hierarchy holds (v1: the cpu controller's own list).
 */
export function cpuWeightOf(hostKey: string, group: string): { weight: number; pids: number[] } {
  const weight = readText(groupFile("cpu", hostKey, group, cgroupV2() ? "cpu.weight" : "cpu.shares"));
  assert.ok(weight !== undefined, `no CPU weight of cgroup ${group}`);
  const procs = readText(groupFile("cpu", hostKey, group, "cgroup.procs")) ?? "";
  return { weight: Number(weight), pids: procs.split("\n").filter(Boolean).map(Number) };
}

/** The groups of the walls booted ahead of the host of `hostKey` (not yet assigned an instance). */
export function warmGroupsOf(hostKey: string): string[] {
  const dir = hostCgroupDir(cgroupV2() ? "/sys/fs/cgroup" : "/sys/fs/cgroup/cpu", hostKey);
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true })
    .filter((group) => group.isDirectory() && group.name.startsWith(WARM_PREFIX))
    .map((group) => group.name);
}

/**
 * How often the memory limit of the host group of `hostKey` itself (not one of its groups')
 * was reached: v1's `memory.failcnt`, v2's local `max` events.
 */
export function hostMemoryLimitHits(hostKey: string): number {
  if (cgroupV2()) return counterOf(groupFile("memory", hostKey, undefined, "memory.events.local"), "max");
  const text = readText(groupFile("memory", hostKey, undefined, "memory.failcnt"));
  assert.ok(text !== undefined, `no memory.failcnt of host ${hostKey}`);
  return Number(text);
}

/** The host group of a provider created with this `hostKey` in each hierarchy where it exists. */
function hostGroupDirs(hostKey: string): { hierarchy: string; dir: string; groups: string[] }[] {
  const roots = cgroupV2() ? ["/sys/fs/cgroup"] : v1Hierarchies().map((c) => `/sys/fs/cgroup/${c}`);
  return roots.flatMap((root) => {
    const dir = hostCgroupDir(root, hostKey);
    if (!existsSync(dir)) return [];
    const groups = readdirSync(dir, { withFileTypes: true }).filter((group) => group.isDirectory());
    return [{ hierarchy: root.split("/").pop()!, dir, groups: groups.map((group) => group.name) }];
  });
}

/**
 * The cgroup directories a provider created with this `hostKey` left, in any hierarchy (its
 * host group included): none once it is closed.
 */
export function cgroupsLeftOfHostKey(hostKey: string): string[] {
  return hostGroupDirs(hostKey).flatMap(({ dir, groups }) => [dir, ...groups.map((group) => join(dir, group))]);
}

/**
 * Removes the cgroups a host killed for good left (a host's next run reclaims them; this one
 * has none). Its walls ended with it: a group still holding a process after 5 s fails the test.
 */
export async function removeHostCgroups(workDir: string): Promise<void> {
  for (const { dir, groups } of hostGroupDirs(hostCgroupKey(workDir))) {
    for (const group of groups) await rmdirOnceEmpty(join(dir, group));
    await rmdirOnceEmpty(dir);
  }
}

/** Every live process in the groups of a provider created with this `hostKey`: pid → start time. */
export function hostKeyMembers(hostKey: string): Map<number, number> {
  const members = new Map<number, number>();
  for (const { dir, groups } of hostGroupDirs(hostKey))
    for (const group of groups) {
      for (const pid of procsOf(join(dir, group))) {
        const stat = readProcStat(pid);
        if (stat && stat.state !== "Z") members.set(pid, stat.startTime);
      }
    }
  return members;
}

/** Freezes the group `group` of `hostKey` (cgroup v1's freezer or v2's `cgroup.freeze`). */
export function freezeGroup(hostKey: string, group: string): void {
  if (cgroupV2()) writeFileSync(join(hostCgroupDir("/sys/fs/cgroup", hostKey), group, "cgroup.freeze"), "1");
  else writeFileSync(join(hostCgroupDir("/sys/fs/cgroup/freezer", hostKey), group, "freezer.state"), "FROZEN");
}

/**
 * Removes whatever a provider created with this `hostKey` left, however it was left: each group
 * thawed and its processes SIGKILLed (the kernel's lists), then every group and the host's own
 * removed. A test's cleanup, run before its assertions, so that a failed one leaves nothing.
 */
export async function clearHostKey(hostKey: string): Promise<void> {
  const places = hostGroupDirs(hostKey);
  const groupDirs = places.flatMap(({ dir, groups }) => groups.map((group) => join(dir, group)));
  for (const dir of groupDirs) {
    const thaw = cgroupV2() ? ["cgroup.freeze", "0"] : ["freezer.state", "THAWED"];
    if (existsSync(join(dir, thaw[0]!))) writeFileSync(join(dir, thaw[0]!), thaw[1]!);
  }
  const killAll = () => {
    for (const pid of groupDirs.flatMap(procsOf)) if (pid > 1 && pid !== process.pid) kill(pid);
    return groupDirs.every((dir) => procsOf(dir).length === 0);
  };
  await pollUntil(killAll, 10_000);
  for (const dir of groupDirs) await rmdirOnceEmpty(dir);
  for (const { dir } of places) await rmdirOnceEmpty(dir);
}

const procsOf = (groupDir: string): number[] =>
  (readText(join(groupDir, "cgroup.procs")) ?? "").split("\n").filter(Boolean).map(Number);

function kill(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // Gone meanwhile.
  }
}

/**
 * Every pid any hierarchy lists in the groups of a provider created with this `hostKey` (zombies
 * too), each as "<hierarchy>/<group>: <pid> <state> <command line>": what a failure names.
 */
export function cgroupListing(hostKey: string): string[] {
  return hostGroupDirs(hostKey).flatMap(({ hierarchy, dir, groups }) =>
    groups.flatMap((group) =>
      (readText(join(dir, group, "cgroup.procs")) ?? "")
        .split("\n")
        .filter(Boolean)
        .map((pid) => {
          const command = (readText(`/proc/${pid}/cmdline`) ?? "").replaceAll("\0", " ").trim();
          return `${hierarchy}/${group}: ${pid} ${processState(Number(pid)) ?? "gone"} ${command}`;
        }),
    ),
  );
}

/** What a failure says of a process that should be gone: its state, parent, threads and command line. */
export function describeProcess(pid: number): string {
  const status = readText(`/proc/${pid}/status`) ?? "";
  const field = (name: string) => new RegExp(`^${name}:\\s*(.*)$`, "m").exec(status)?.[1] ?? "?";
  const command = (readText(`/proc/${pid}/cmdline`) ?? "").replaceAll("\0", " ").trim();
  return `${pid} ${field("State")} ppid ${field("PPid")} threads ${field("Threads")} ${command || field("Name")}`;
}

/** Gone, or a zombie nobody has reaped yet. */
export const isGone = (pid: number) => processState(pid) === undefined || processState(pid) === "Z";

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8").trim();
  } catch {
    return undefined;
  }
}

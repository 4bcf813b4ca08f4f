// What hosts that died without their shutdown (SIGKILL, OOM, a killed test runner) left on this
// machine. A running instance dies with its host (the death signals of its wall), but a frozen
// one cannot: cgroup v1's freezer holds even SIGKILL until it is thawed, so a host killed while
// one of its groups was frozen (a suspended instance; any wall in the middle of its group kill)
// leaves it for good. Every isolated provider, as it starts, claims its own key (host-lock.ts)
// and sweeps the keys whose lock nobody holds: their groups' processes are killed (a frozen
// group is thawed for the kill to land), their groups removed, their run directories (runsc's
// state, sockets) deleted. A live host's key is never touched: its lock is held as long as its
// process lives, and no pid read from a file is ever signalled.
import { mkdir, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_CGROUP_PARENT, existingHostCgroups, type InstanceCgroup } from "./cgroups.ts";
import { claimLock, takeAbandoned, type HeldLock } from "./host-lock.ts";
import { isProcessAlive, readProcStat } from "./proc.ts";
import { pollUntil } from "./provider-util.ts";

/** What a sweep did for one host that is gone. */
export interface SweptHost {
  readonly hostKey: string;
  /** Its processes that were still alive, killed (host pids, from the kernel's lists). */
  readonly pids: readonly number[];
  /** Why something of it is left for a later sweep; undefined when nothing is. */
  readonly left?: string;
}

export interface SweepPlaces {
  /** Where hosts keep their lock files, `<hostKey>.lock`. */
  readonly lockDir: string;
  /** Parent of the hosts' run directories (`<runRoot>/<hostKey>`), where they have one. */
  readonly runRoot?: string;
}

export interface HostClaim {
  /** Held for the host's life: `release` once nothing of it is left, else `abandon`. */
  readonly lock: HeldLock;
  readonly swept: SweptHost[];
}

const LOCK_SUFFIX = ".lock";
/** How long a claim waits for a sweep of its own key under way elsewhere (its kills' bound, and more). */
const CLAIM_WAIT_MS = 30_000;
/**
 * How long SIGKILLed processes of a gone host may take to leave (their exit is CPU work: tens
 * of ms measured beside a load of 30 on 2 cores). Past it, the host is left to a later sweep.
 */
export const SWEEP_KILL_TIMEOUT_MS = 15_000;

const lockPath = (lockDir: string, hostKey: string) => join(lockDir, `${hostKey}${LOCK_SUFFIX}`);

/**
 * Claims `hostKey` for this process for as long as it lives (waiting out a sweep of it), then
 * sweeps the other keys of hosts that are gone, telling `log` what it killed. Lock files are in
 * `runRoot` (a root host's run directories' parent), else in a directory of this user's.
 */
export async function claimHost(options: {
  readonly hostKey: string;
  readonly runRoot: string | undefined;
  readonly cgroupParent?: string | undefined;
  readonly log: (message: string) => void;
}): Promise<HostClaim> {
  const { hostKey, runRoot } = options;
  const lockDir = runRoot ?? join(tmpdir(), `typed-service-microvms-${process.getuid?.() ?? "user"}`);
  await mkdir(lockDir, { recursive: true, mode: runRoot ? 0o711 : 0o700 });
  const cgroupParent = options.cgroupParent ?? DEFAULT_CGROUP_PARENT;
  const path = lockPath(lockDir, hostKey);
  const lock = await claimLock(path, { cgroupParent }, CLAIM_WAIT_MS, () =>
    options.log(`waiting up to ${CLAIM_WAIT_MS} ms for ${path}: a sweep of it, or another live host with this key`),
  );
  const swept = await sweepGoneHosts({ lockDir, ...(runRoot ? { runRoot } : {}) }, hostKey);
  const killed = swept.reduce((sum, host) => sum + host.pids.length, 0);
  const left = swept.flatMap((host) => (host.left ? [`; ${host.hostKey} left: ${host.left}`] : []));
  if (killed > 0 || left.length > 0)
    options.log(`swept ${swept.length} host(s) that are gone: ${killed} process(es) killed${left.join("")}`);
  return { lock, swept };
}

/** Sweeps every host key in `places.lockDir` whose host is gone; `ownKey` is skipped. */
export async function sweepGoneHosts(places: SweepPlaces, ownKey?: string): Promise<SweptHost[]> {
  const names = await readdir(places.lockDir).catch(() => [] as string[]);
  const keys = names
    .filter((name) => name.endsWith(LOCK_SUFFIX))
    .map((name) => name.slice(0, -LOCK_SUFFIX.length))
    .filter((key) => key !== ownKey && /^(?!\.\.?$)[A-Za-z0-9._-]+$/.test(key));
  const swept = await Promise.all(keys.map((key) => sweepHost(places, key)));
  return swept.filter((host): host is SweptHost => host !== undefined);
}

/** Sweeps one host key if its host is gone (its lock could be taken); undefined when it lives. */
async function sweepHost(places: SweepPlaces, hostKey: string): Promise<SweptHost | undefined> {
  const taken = await takeAbandoned(lockPath(places.lockDir, hostKey)).catch(() => undefined);
  if (!taken) return undefined;
  const pids: number[] = [];
  try {
    const groups = await existingHostCgroups(hostKey, taken.record?.cgroupParent);
    const outcomes = await Promise.allSettled((groups?.existing() ?? []).map((group) => reclaimGroup(group)));
    for (const outcome of outcomes) if (outcome.status === "fulfilled") pids.push(...outcome.value);
    const failed = outcomes.find((outcome) => outcome.status === "rejected");
    if (failed) throw failed.reason;
    await groups?.remove();
    if (await existingHostCgroups(hostKey, taken.record?.cgroupParent)) throw new Error("its host group is left");
    if (places.runRoot) await rm(join(places.runRoot, hostKey), { recursive: true, force: true });
    await taken.lock.release();
    return { hostKey, pids };
  } catch (cause) {
    await taken.lock.abandon();
    return { hostKey, pids, left: cause instanceof Error ? cause.message : String(cause) };
  }
}

/**
 * Kills every process of `group` (frozen ones too: the kill thaws the group after its SIGKILLs)
 * and removes it, once the processes it had have ended (a pid namespace's init leaves
 * `cgroup.procs` before it has). Resolves with the pids that were alive.
 */
export async function reclaimGroup(group: InstanceCgroup, timeoutMs = SWEEP_KILL_TIMEOUT_MS): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  const members = new Map<number, number>();
  for (const pid of group.pids()) {
    const stat = readProcStat(pid);
    if (stat && isProcessAlive(pid)) members.set(pid, stat.startTime);
  }
  await group.kill(timeoutMs);
  const ended = () => [...members].every(([pid, startTime]) => !isProcessAlive(pid, startTime));
  if (!(await pollUntil(ended, Math.max(0, deadline - Date.now()))))
    throw new Error(`processes of cgroup ${group.name} outlived their SIGKILL by ${timeoutMs} ms`);
  await group.remove();
  return [...members.keys()];
}

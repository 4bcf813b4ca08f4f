// The boot of an isolated provider's wall: a boot slot (restores take none), a host uid, a
// cgroup and a directory of its own, the launcher's wall around a runtime that waits for its
// image, tracked until it ends and its cgroup, directory and uid are given back.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { BootSlots } from "./boot-slots.ts";
import type { CgroupLimits, HostCgroups, InstanceCgroup } from "./cgroups.ts";
import type { UidPool } from "./instance-uids.ts";
import { forceStop } from "./isolated-stop.ts";
import {
  membersEnded,
  type Launched,
  type Launcher,
  type RestoreSource,
  type Tracked,
  type WallWeight,
} from "./isolated-walls.ts";
import { bootLine, outputDrained, waitForExit, watchOutput, type OutputSink } from "./process-io.ts";
import { pollUntil, type BundleCache } from "./provider-util.ts";
import { MicrovmHostError, MicrovmProviderError } from "./provider.ts";
import { makeSocketDir } from "./runtime-socket.ts";
import { countedCpus } from "../runtime/cpu-count.ts";
import { LAUNCH_TEMPLATE_LINE } from "../runtime/startup-input.ts";
import { RUNTIME_STOPPED, StateReason, stateReason } from "../wire/state-reasons.ts";

/** Names a wall booted ahead until it is assigned its instance. */
export const WARM_PREFIX = "warm-";
const MiB = 1024 * 1024;
/** Node's own memory beyond its heap (code, buffers, the runtime). */
const NODE_HEADROOM_MIB = 128;

export interface WallBootDeps {
  readonly launcher: Launcher;
  readonly cgroups: HostCgroups;
  readonly bundles: BundleCache;
  readonly slots: BootSlots;
  readonly uids: UidPool;
  /** The walls of the provider: a booted wall is added, and removed once released. */
  readonly tracked: Set<Tracked>;
  /** Parent of the instances' directories as root (else `instances/` in the work directory). */
  readonly runDir: string | undefined;
  readonly asRoot: boolean;
  /** CPU quota per instance in cores. */
  readonly cpus: number;
  /** Processes and threads per instance's code. */
  readonly pids: number;
  readonly scratchMiB: number;
  readonly permissions: boolean;
  readonly onOutput: OutputSink | undefined;
  closed(): boolean;
}

/** Where a wall runs before it is launched: its name, directory, cgroup and uid. */
interface WallPlace {
  readonly name: string;
  readonly dir: string;
  readonly cgroup: InstanceCgroup;
  readonly uid: number | undefined;
  /** Whether its uid goes back to the pool when it ends (not a template's, not a shared one). */
  readonly ownsUid: boolean;
  /** A restore of a launch snapshot, sharing its template's uid. */
  readonly shared: boolean;
}

/** `boot` and `stopFailedWall` of a provider (see WallOps.boot). */
export function wallBoot(deps: WallBootDeps) {
  const { launcher, cgroups, uids } = deps;
  /** Uids of launch snapshots' templates: never given back, shared by their restores. */
  const launchUids = new Set<number>();
  const limitsFor = (memoryMiB: number): CgroupLimits => ({
    memoryBytes: (memoryMiB + deps.scratchMiB + NODE_HEADROOM_MIB + launcher.overheadMiB) * MiB,
    cpus: deps.cpus,
    pids: deps.pids + launcher.overheadPids,
  });
  const hostFailure = (cause: unknown, more: { timedOut?: boolean; stderr?: string } = {}) =>
    new MicrovmHostError("the host could not start an instance's wall", {
      cause,
      ...more,
      missing: launcher.needs.filter((path) => !existsSync(path)),
    });

  /**
   * Starts a wall around a runtime that waits for its image; resolves once the wall is up (not
   * waiting for node: a start sends the module at once). Every failure is the host's
   * (`MicrovmHostError`): no image has been sent yet. A wall booted ahead comes with its `weight`.
   */
  async function boot(
    memoryMiB: number,
    deadline: number,
    signal?: AbortSignal,
    restoring?: RestoreSource,
    template = false,
    weight?: WallWeight,
  ): Promise<Tracked> {
    if (deps.closed()) throw new MicrovmProviderError("provider is closed");
    // A restore boots no runtime: it resumes one from its image.
    if (restoring) return bootWall(memoryMiB, deadline, signal, restoring, template, weight);
    const { slots } = deps;
    const slot = await slots.take(deadline, signal, (waitedMs) => {
      const busy = `${slots.running} walls were booting and ${slots.waiting} launches, this one among them, waited`;
      return new MicrovmHostError(`the host was too busy to boot an instance's wall: ${busy} (${waitedMs} ms)`, {
        timedOut: true,
      });
    });
    let entry: Tracked;
    try {
      entry = await bootWall(memoryMiB, deadline, signal, restoring, template, weight);
    } catch (err) {
      slot.release();
      throw err;
    }
    // The slot is the wall's until its runtime is up (the boot line), it ends, or its start's
    // deadline passes (that start then fails and stops it).
    void bootLine(entry.output, deadline, undefined, entry.exited).then(slot.release, slot.release);
    return entry;
  }

  /** `boot` once its turn came. */
  async function bootWall(
    memoryMiB: number,
    deadline: number,
    signal: AbortSignal | undefined,
    restoring: RestoreSource | undefined,
    template: boolean,
    weight: WallWeight | undefined,
  ): Promise<Tracked> {
    const runtimeFile = await deps.bundles.runtime().catch((cause: unknown) => {
      throw new MicrovmHostError("the host could not bundle the instance runtime", { cause });
    });
    if (deps.closed()) throw new MicrovmProviderError("provider is closed");
    const place = await placeWall(memoryMiB, restoring, template, weight);
    let launched: Launched;
    try {
      const launch = {
        name: place.name,
        runtimeFile,
        cgroup: place.cgroup,
        uid: place.uid,
        dir: place.dir,
        socketDir: makeSocketDir(place.dir, "run", place.uid),
        heapMiB: memoryMiB,
        scratchBytes: deps.scratchMiB * MiB,
        cpus: countedCpus(deps.cpus),
        pids: deps.pids,
        permissions: deps.permissions,
        launchTemplate: template || place.shared,
      };
      launched = restoring ? await launcher.restore!(launch, restoring.imageDir) : await launcher.launch(launch);
    } catch (cause) {
      await releaseWall(place, place.cgroup);
      throw hostFailure(cause);
    }
    const entry = trackWall(place, launched, memoryMiB, restoring?.secret);
    // A restored runtime has its secret in the memory it was saved with (a launch snapshot's
    // is told it after the restore); a template gets none.
    if (!restoring) launched.child.stdin?.write(`${template ? LAUNCH_TEMPLATE_LINE : entry.secret}\n`);
    try {
      await wallUp(entry, deadline, signal);
    } catch (cause) {
      throw (
        (await stopFailedWall(entry, cause, deadline, signal)) ??
        new MicrovmHostError("the host could not start an instance's wall", { cause })
      );
    }
    return entry;
  }

  /** Claims a wall's uid and makes its cgroup (its directory is made by its socket directory). */
  async function placeWall(
    memoryMiB: number,
    restoring: RestoreSource | undefined,
    template: boolean,
    weight: WallWeight | undefined,
  ): Promise<WallPlace> {
    const name = `${WARM_PREFIX}${randomBytes(6).toString("hex")}`;
    const dir = join(deps.runDir ?? join(await deps.bundles.workDir(), "instances"), name);
    // A restored instance runs as the uid it was saved with: its socket directory must be its own.
    // A launch snapshot's restores share its template's uid, which the snapshot keeps for this
    // provider's life (an instance restored from it and later suspended comes back as it, too).
    const shared = restoring !== undefined && (restoring.shared === true || launchUids.has(restoring.uid));
    if (restoring && !shared && !(deps.asRoot && uids.claim(restoring.uid)))
      throw new MicrovmProviderError(`uid ${restoring.uid} of the checkpoint is not free here`);
    const ownsUid = !template && !shared;
    const limits = { ...limitsFor(memoryMiB), background: weight?.background === true };
    const cgroup = await cgroups.create(name, limits).catch((cause: unknown) => {
      if (restoring && ownsUid) uids.give(restoring.uid);
      throw new MicrovmHostError("the host could not make an instance's cgroup", { cause });
    });
    weight?.placed(cgroup);
    const uid = restoring ? restoring.uid : deps.asRoot ? uids.take() : undefined;
    if (template && uid !== undefined) launchUids.add(uid);
    return { name, dir, cgroup, uid, ownsUid, shared };
  }

  /** Gives back what a wall held once it ended: its cgroup (`group`, under its last name), directory and uid. */
  async function releaseWall(place: WallPlace, group: InstanceCgroup): Promise<void> {
    await group.kill().catch(() => undefined);
    await group.remove().catch(() => undefined);
    await rm(place.dir, { recursive: true, force: true }).catch(() => undefined);
    if (place.uid !== undefined && place.ownsUid) uids.give(place.uid);
  }

  /** The entry of a launched wall, tracked until it ended and was released. */
  function trackWall(place: WallPlace, launched: Launched, memoryMiB: number, secret: string | undefined): Tracked {
    const { child } = launched;
    // The wall's process can exit while its children are still ending: the instance is gone
    // once its cgroup is empty and every process noted in it has ended (a zombie has).
    const exited = waitForExit(child).then(async () => {
      await pollUntil(() => entry.cgroup.pids().length === 0 && membersEnded(entry), 2_000);
    });
    const output = watchOutput(child, place.name, (_name, stream, line) =>
      deps.onOutput?.(entry.microvmId ?? place.name, stream, line),
    );
    const entry: Tracked = {
      launched,
      cgroup: place.cgroup,
      exited,
      uid: place.uid,
      dir: place.dir,
      secret: secret ?? randomBytes(24).toString("base64url"),
      heapMiB: memoryMiB,
      output,
      done: false,
      stopping: false,
      members: new Map(),
    };
    deps.tracked.add(entry);
    entry.released = entry.exited.then(async () => {
      entry.done = true;
      entry.exitReason =
        entry.cgroup.oomKills() > 0
          ? stateReason(StateReason.InstanceExited, "out of memory (the instance reached its memory limit)")
          : RUNTIME_STOPPED;
      entry.socket?.close();
      // A rename under way (assign) would leave the group under its new name.
      await entry.renaming?.catch(() => undefined);
      await releaseWall(place, entry.cgroup);
      deps.tracked.delete(entry);
    });
    return entry;
  }

  /** Waits for the launcher's wall to be up and inside its cgroup. */
  async function wallUp(entry: Tracked, deadline: number, signal: AbortSignal | undefined): Promise<void> {
    const { child } = entry.launched;
    await entry.launched.ready(deadline, signal, entry.output.stderrTail);
    // Its shell joins each hierarchy's group before it becomes the wall: done before the
    // group may be renamed for its instance.
    const joined = await pollUntil(
      () => child.pid !== undefined && (entry.cgroup.holds(child.pid) || child.exitCode !== null),
      Math.max(0, deadline - Date.now()),
    );
    if (!joined) throw new Error("the wall did not join its cgroup in time");
  }

  /**
   * Stops a wall that did not come up and says why it failed: the host's failure (its stderr
   * read to the end, the files it needs that are missing) while its runtime had not printed its
   * boot line, else undefined (the image's doing).
   */
  async function stopFailedWall(
    entry: Tracked,
    cause: unknown,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<MicrovmHostError | undefined> {
    const bootedBefore = entry.output.booted;
    await forceStop(entry);
    await entry.exited;
    await outputDrained(entry.launched.child, 1_000);
    // A wall stopped because time ran out is judged by what it had printed by then: a boot line
    // read while it was being killed does not make the host's slowness the image's.
    const timedOut = Date.now() >= deadline || signal?.aborted === true;
    if (timedOut ? bootedBefore : entry.output.booted) return undefined;
    return hostFailure(cause, { timedOut, stderr: entry.output.stderrTail.join("\n") });
  }

  return { boot, stopFailedWall };
}

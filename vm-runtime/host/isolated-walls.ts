// The walls of the isolated providers (bubblewrap, gVisor) as the provider and its
// checkpoints see them: what a launcher starts, what it returns, and what the provider tracks.

import type { ChildProcess } from "node:child_process";
import type { InstanceCgroup } from "./cgroups.ts";
import { isProcessAlive, readProcStat } from "./proc.ts";
import type { SavedInstance } from "./checkpoint-image.ts";
import type { OutputWatch } from "./process-io.ts";
import type { MicrovmHandle } from "./provider.ts";
import type { RuntimeSocket } from "./runtime-socket.ts";
import type { StateReasonText } from "../wire/state-reasons.ts";

/** One wall as a launcher starts it, before it knows its image (sent on stdin). */
export interface InstanceLaunch {
  /** Unique among this host's instances: its directory's (and first cgroup) name. */
  readonly name: string;
  /** The runtime bundle (the same for every image). */
  readonly runtimeFile: string;
  readonly cgroup: InstanceCgroup;
  /** Host uid of the instance; undefined when the host is not root (its own uid then). */
  readonly uid: number | undefined;
  /** The instance's own directory on the host (root's, 0700), for whatever the launcher needs. */
  readonly dir: string;
  /** Host directory mounted at /run/microvm inside, owned by `uid`: the runtime's socket goes there. */
  readonly socketDir: string;
  readonly heapMiB: number;
  readonly scratchBytes: number;
  /** The CPUs the instance counts: its CPU quota rounded up (it may run on every CPU). */
  readonly cpus: number;
  /** Processes and threads the instance's code may have (the wall's own come on top). */
  readonly pids: number;
  readonly permissions: boolean;
  /** A launch snapshot's template, or a restore of one: node draws randomness from the CPU. */
  readonly launchTemplate: boolean;
}

/** A started wall around one instance. */
export interface Launched {
  /** The process whose exit ends the instance; its stdin carries the secret, stdout/stderr the output. */
  readonly child: ChildProcess;
  /** Resolves once the wall is up (rejects if it failed first). */
  ready(deadline: number, signal: AbortSignal | undefined, stderrTail: readonly string[]): Promise<void>;
  /** The pid that names the instance in its record (never signalled from storage). */
  pid(): number | undefined;
  /** Asks the runtime alone to stop (SIGTERM). */
  stop(): Promise<void>;
  /** Ends the wall's init at once; the group kill follows if that is not enough. */
  kill(): Promise<void>;
  /** Sends the runtime `CHECKPOINT_SIGNAL` (walls that can checkpoint). */
  signalRuntime?(): Promise<void>;
  /** Saves the sandbox, memory and scratch, into `imageDir`; the wall ends. */
  checkpoint?(imageDir: string): Promise<void>;
  /** Resolves once a restored sandbox runs; rejects when the wall ends first, at `deadline` or on `signal`. */
  running?(deadline: number, signal: AbortSignal): Promise<void>;
}

export interface Launcher {
  readonly name: "sandbox" | "gvisor";
  /** Memory the wall itself needs per instance beyond node's, in MiB. */
  readonly overheadMiB: number;
  /** Host threads the wall itself runs per instance (the cgroup's pids limit adds them). */
  readonly overheadPids: number;
  /** Host files the wall runs or binds (node, its libraries, the wall's binary): a failed boot names those gone. */
  readonly needs: readonly string[];
  launch(instance: InstanceLaunch): Promise<Launched>;
  /** Starts a wall restoring the checkpoint in `imageDir` (walls that can checkpoint). */
  restore?(instance: InstanceLaunch, imageDir: string): Promise<Launched>;
}

/** What a restore boots from: the image and what the checkpoint recorded of its instance. */
export interface RestoreSource extends SavedInstance {
  readonly imageDir: string;
  /**
   * A launch snapshot's: its uid is its template's, reserved for the snapshot and shared by
   * every instance restored from it (neither claimed nor given back by one of them).
   */
  readonly shared?: boolean;
}

/** One wall the provider started (warm, or serving its instance). */
export interface Tracked {
  readonly launched: Launched;
  /** Renamed after its instance when a warm wall is assigned. */
  cgroup: InstanceCgroup;
  readonly exited: Promise<void>;
  readonly uid: number | undefined;
  /** The instance's directory on the host (its socket directory is `run/` in it). */
  readonly dir: string;
  readonly secret: string;
  readonly heapMiB: number;
  /** Its output: the last stderr lines, and whether the runtime printed its boot line. */
  readonly output: OutputWatch;
  /** The instance it serves; undefined while the wall is warm. */
  microvmId?: string;
  done: boolean;
  /** Set when terminate or close ends it: its exit is then no news. */
  stopping: boolean;
  /** Why it ended, read from its cgroup before the group is removed. */
  exitReason?: StateReasonText;
  /**
   * Its processes as last seen in its cgroup, pid to start time (`noteMembers`): it has ended
   * once each has, which its cgroup alone does not say (below).
   */
  readonly members: Map<number, number>;
  /** Resolves once its cgroup, directory and uid are given back after it ended. */
  released?: Promise<void>;
  /** Its cgroup's rename for the instance it serves, while under way (`released` waits for it). */
  renaming?: Promise<unknown>;
  socket?: RuntimeSocket;
  handle?: MicrovmHandle;
}

/**
 * Records the processes now in `entry`'s cgroup. The kernel drops a process from
 * `cgroup.procs` once all its threads began to exit, while it may still run: a pid namespace's
 * init (gVisor's sandbox) waits there until its namespace has ended.
 */
export function noteMembers(entry: Tracked): void {
  for (const pid of entry.cgroup.pids()) {
    const stat = readProcStat(pid);
    if (stat) entry.members.set(pid, stat.startTime);
  }
}

/** Whether every process `noteMembers` saw has ended (a zombie has; a reused pid is another process). */
export function membersEnded(entry: Tracked): boolean {
  for (const [pid, startTime] of entry.members) if (isProcessAlive(pid, startTime)) return false;
  return true;
}

/**
 * The CPU weight of a wall booted ahead (isolated-warm.ts): its group is made at the background
 * weight unless `raise` came first, and gets the default one on `raise`.
 */
export interface WallWeight {
  /** Whether its group is to be made at the background weight (`raise` not called yet). */
  readonly background: boolean;
  /** Its group, once made: a `raise` called before gets written to it now. */
  placed(cgroup: InstanceCgroup): void;
}

/** What checkpoints and launch snapshots use of the provider that tracks the walls. */
export interface WallOps {
  /** Starts a wall: a fresh one, a restore of `restoring`, or a launch snapshot's template. */
  boot(
    heapMiB: number,
    deadline: number,
    signal: AbortSignal | undefined,
    restoring?: RestoreSource,
    template?: boolean,
  ): Promise<Tracked>;
  /** Names the wall (and its cgroup) after its instance. */
  assign(entry: Tracked, microvmId: string): Promise<void>;
  /** Waits for the runtime's socket and readiness answer, after `before`; resolves with its handle. */
  answering(
    entry: Tracked,
    microvmId: string,
    deadline: number,
    signal: AbortSignal | undefined,
    before?: (probeSignal: AbortSignal) => Promise<void>,
  ): Promise<MicrovmHandle>;
  /** Ends a wall at once. */
  forceStop(entry: Tracked): Promise<void>;
}

// Reconcile at host start, before serving: an earlier run of this host id may have died
// (SIGKILL, crash) leaving records that say RUNNING and, for suspended instances, frozen or
// stopped processes (a running instance dies with its host; a frozen one cannot). The
// provider kills what it finds in its own cgroup or work directory; every such record is
// made TERMINATED, but for SUSPENDED ones whose snapshot is stored (they hold no process and
// survive their host): those the host adopts again.
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { INSTANCE_MARKER } from "../host/process-provider.ts";
import type { MicrovmProvider } from "../host/provider.ts";
import { log } from "../../platform/index.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore } from "./store.ts";
import { StateReason, stateReason } from "../wire/state-reasons.ts";

export interface ReconcileReport {
  /** Records of this host moved to TERMINATED. */
  readonly terminated: number;
  /** Instance processes of an earlier run killed. */
  readonly killed: number;
  /** SUSPENDED records with a stored snapshot, left to be adopted. */
  readonly kept: number;
}

/** A record that survives its host: SUSPENDED into a stored snapshot, no process of it anywhere. */
export const survivesHost = (record: MicrovmRecord): boolean =>
  record.state === "SUSPENDED" && record.checkpoint !== undefined;

/** Stated on records whose process was already gone when the host came back. */
export const REASON_PROCESS_GONE = stateReason(StateReason.HostRestarted, "instance process gone");
/** Stated on records whose (suspended) process outlived the host and was killed. */
export const REASON_PROCESS_KILLED = stateReason(StateReason.HostRestarted, "instance process killed");

export async function reconcileHost(
  store: MicrovmStore,
  hostId: string,
  workDir: string,
  provider: MicrovmProvider,
  /** This host can restore snapshots: records that survive their host are kept for it. */
  keepSnapshots = false,
): Promise<ReconcileReport> {
  const mine = (await store.list()).filter(({ record }) => record.hostId === hostId && record.state !== "TERMINATED");
  // What the provider finds in this host's own cgroup or work directory; a record's pid only
  // names which record a killed process belonged to, it is never signalled.
  const reclaimed = (await provider.reclaim?.()) ?? [];
  const killedPids = new Set(reclaimed.flatMap((instance) => instance.pids));

  let count = 0;
  let kept = 0;
  for (const { record } of mine) {
    if (isTerminal(record.state)) continue; // FAILED stays FAILED; its process (if any) was killed above
    if (keepSnapshots && survivesHost(record)) {
      kept += 1;
      continue;
    }
    const pid = record.handle?.pid;
    const reason = pid !== undefined && killedPids.has(pid) ? REASON_PROCESS_KILLED : REASON_PROCESS_GONE;
    const stored = await store.update(record.microvmId, (current) =>
      current.hostId === hostId && !isTerminal(current.state) ? terminated(current, "TERMINATED", reason) : undefined,
    );
    if (stored?.record.state === "TERMINATED") count += 1;
  }
  await removeStaleWorkDirs(workDir);
  if (count > 0 || reclaimed.length > 0 || kept > 0)
    log.info({ hostId, terminated: count, killed: reclaimed.length, kept }, "microvm host reconciled");
  return { terminated: count, killed: reclaimed.length, kept };
}

/**
 * Bundle and scratch directories of earlier runs, with their launch snapshots (the provider of
 * this run makes its own, `<wall>-XXXXXX`, after this).
 */
async function removeStaleWorkDirs(workDir: string): Promise<void> {
  const entries = await readdir(workDir).catch(() => [] as string[]);
  await Promise.all(
    entries
      .filter((name) => name.startsWith(`${INSTANCE_MARKER}-`) || /^(sandbox|gvisor)-/.test(name))
      .map((name) => rm(join(workDir, name), { recursive: true, force: true }).catch(() => undefined)),
  );
}

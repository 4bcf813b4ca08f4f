// The periodic sweep every host runs over the `microvms` bucket: terminal records past their
// retention are deleted (compare-and-set, so hosts sweeping at once do no harm), records of
// hosts that stopped answering (two sweeps in a row) are marked TERMINATED, and this host's
// live instances whose record ended elsewhere or vanished are terminated to match.
import type { NatsConnection } from "@nats-io/transport-node";
import { log } from "../../platform/index.ts";
import { survivesHost } from "./reconcile.ts";
import { hostGoneReason, ownerAnswers } from "./owners.ts";
import { isTerminal, terminated, type MicrovmRecord, type MicrovmStore, type StoredRecord } from "./store.ts";
import { StateReason, storedReason, type StateReasonText } from "../wire/state-reasons.ts";

export interface SweeperOptions {
  readonly store: MicrovmStore;
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly hostId: string;
  /** How long TERMINATED and FAILED records stay readable. */
  readonly retentionMs: number;
  /** Time between sweeps (default: half the retention, 1 s to 30 s). */
  readonly intervalMs?: number;
  /** Ids of this host's live instances. */
  readonly liveInstances: () => string[];
  /** A live instance's record is terminal or gone: the instance must end (`reason`). */
  readonly disowned: (microvmId: string, reason: StateReasonText) => void;
  /** Deletes the stored snapshot of an expired record that names one. */
  readonly discardSnapshot?: (record: MicrovmRecord) => Promise<void>;
  /** Takes over a gone host's instance that survives it (SUSPENDED into a snapshot); true if taken. */
  readonly adopt?: (stored: StoredRecord) => Promise<boolean>;
}

export interface SweepReport {
  readonly deleted: number;
  readonly ownerless: number;
}

export interface Sweeper {
  /** One sweep now (tests; the timer keeps running). */
  sweep(): Promise<SweepReport>;
  stop(): Promise<void>;
}

export function startSweeper(options: SweeperOptions): Sweeper {
  const intervalMs = options.intervalMs ?? Math.min(30_000, Math.max(1_000, options.retentionMs / 2));
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<SweepReport> | undefined;
  let stopped = false;
  /** Owners that did not answer the previous sweep's ping. */
  let suspects = new Set<string>();

  const sweepOnce = async (): Promise<SweepReport> => {
    const live = options.liveInstances();
    const records = await options.store.list();
    matchLive(options, live, records);
    const deleted = await deleteExpired(options, records);
    const silent = await silentOwners(options, records);
    const ownerless = await endOwnerless(
      options,
      records,
      [...silent].filter((hostId) => suspects.has(hostId)),
    );
    suspects = silent;
    log.debug({ records: records.length, deleted, ownerless }, "microvm sweep");
    return { deleted, ownerless };
  };
  const sweep = () => (running ??= sweepOnce().finally(() => (running = undefined)));
  const schedule = () => {
    if (stopped) return;
    // Jitter, so hosts started together do not sweep in lockstep.
    timer = setTimeout(
      () => {
        sweep()
          .catch((err: unknown) => log.warn({ err }, "microvm sweep failed"))
          .finally(schedule);
      },
      intervalMs * (0.8 + Math.random() * 0.4),
    );
    timer.unref();
  };
  schedule();
  return {
    sweep,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running?.catch(() => undefined);
    },
  };
}

/** Live instances listed before the records were read; a later launch is not judged. */
function matchLive(options: SweeperOptions, live: string[], records: StoredRecord[]): void {
  const byId = new Map(records.map(({ record }) => [record.microvmId, record]));
  for (const microvmId of live) {
    const record = byId.get(microvmId);
    if (!record) options.disowned(microvmId, StateReason.RecordDeleted);
    else if (record.hostId !== options.hostId || isTerminal(record.state)) {
      options.disowned(microvmId, storedReason(record.stateReason));
    }
  }
}

async function deleteExpired(options: SweeperOptions, records: StoredRecord[]): Promise<number> {
  const now = Date.now();
  let deleted = 0;
  for (const { record, revision } of records) {
    if (!isTerminal(record.state) || !record.terminalAt) continue;
    if (now - Date.parse(record.terminalAt) < options.retentionMs) continue;
    if (record.checkpoint) await options.discardSnapshot?.(record);
    if (await options.store.remove(record.microvmId, revision)) deleted += 1;
  }
  return deleted;
}

/** Other hosts with live records that have no subscriber on their own subjects now. */
async function silentOwners(options: SweeperOptions, records: StoredRecord[]): Promise<Set<string>> {
  const owners = new Set<string>();
  for (const { record } of records) {
    if (record.hostId !== options.hostId && !isTerminal(record.state)) owners.add(record.hostId);
  }
  const silent = new Set<string>();
  for (const hostId of owners) if (!(await ownerAnswers(options.nc, options.prefix, hostId))) silent.add(hostId);
  return silent;
}

/** Live records of `gone` hosts become TERMINATED, but those this host adopts (SUSPENDED into a snapshot). */
async function endOwnerless(options: SweeperOptions, records: StoredRecord[], gone: string[]): Promise<number> {
  let count = 0;
  for (const stored of records) {
    const { record } = stored;
    if (!gone.includes(record.hostId) || isTerminal(record.state)) continue;
    if (survivesHost(record) && options.adopt && (await options.adopt(stored))) continue;
    const reason = hostGoneReason(record.hostId);
    const ended = await options.store.update(record.microvmId, (current) =>
      current.hostId === record.hostId && !isTerminal(current.state)
        ? terminated(current, "TERMINATED", reason)
        : undefined,
    );
    if (ended?.record.stateReason === reason) count += 1;
  }
  if (count > 0) log.info({ count, hosts: gone }, "microvm records of gone hosts marked TERMINATED");
  return count;
}

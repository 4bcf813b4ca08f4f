// One instance run by this host: the managed instance (lifecycle machine + provider + proxy)
// tied to its KV record. Every state change is written through the instance's RecordWriter;
// on TERMINATED or FAILED the proxy closes, the process is gone and the host forgets it.
import { launchMicrovmInstance, type MicrovmInstance } from "../lifecycle/instance.ts";
import { microvmState } from "../lifecycle/snapshot.ts";
import type { LifecycleTimeouts } from "../lifecycle/types.ts";
import type { MicrovmHandle, MicrovmProvider } from "../host/provider.ts";
import type { RevokedCheck } from "../host/token-cache.ts";
import type { TokenKey } from "../wire/token.ts";
import { log } from "../../platform/index.ts";
import {
  isTerminal,
  type MicrovmRecord,
  type MicrovmStore,
  type Policy,
  type State,
  type StoredHandle,
  type StoredRecord,
} from "./store.ts";
import { snapshotKeeper } from "../snapshots/keeper.ts";
import type { SnapshotStore } from "../snapshots/store.ts";
import { RecordWriter, recordSignature } from "./writer.ts";
import { StateReason, storedReason } from "../wire/state-reasons.ts";

export interface HostedOptions {
  readonly microvmId: string;
  /** The principal that launched it. */
  readonly owner: string;
  readonly imageIdentifier: string;
  /** `sha256:<hex>` of the module the instance runs. */
  readonly imageDigest?: string;
  /** Module path of the image. */
  readonly image: string;
  readonly idlePolicy: Policy;
  readonly hostId: string;
  readonly store: MicrovmStore;
  readonly provider: MicrovmProvider;
  readonly tokenKey: TokenKey;
  /** Whether a token's API key was revoked since it was issued (the proxy refuses it). */
  readonly tokenRevoked?: RevokedCheck;
  /** Address the proxy binds, and the host written into `endpoint`. */
  readonly proxyBindHost: string;
  readonly proxyHost: string;
  readonly timeouts?: Partial<LifecycleTimeouts>;
  /** Where suspend stores snapshots, when the provider checkpoints (else suspend freezes). */
  readonly snapshots?: { readonly store: SnapshotStore; readonly workDir: string };
  /**
   * A SUSPENDED record with a stored snapshot that this host takes over (an earlier run of it,
   * or a host that is gone): its machine goes on from the record's, the record is claimed at
   * its revision, and a resume restores the snapshot here.
   */
  readonly adopt?: StoredRecord;
  /** Called once the instance is gone (TERMINATED or FAILED and cleaned up). */
  readonly onGone: (hosted: HostedInstance) => void;
}

export interface HostedInstance {
  readonly microvmId: string;
  readonly endpoint: string;
  readonly instance: MicrovmInstance;
  readonly writer: RecordWriter;
  state(): State;
  /** Resolves with the state once it is one of `states`, or the current one after `timeoutMs`. */
  settle(states: readonly State[], timeoutMs: number): Promise<State>;
  /** Resolves when the instance is gone and its last record write is done. */
  readonly gone: Promise<void>;
  /**
   * Its record ended elsewhere or names another host now (an adoption while this host was
   * thought gone): when it ends, its stored snapshot is not this host's to delete.
   */
  disown(): void;
  /**
   * A host shutting down lets go of an instance that survives it (SUSPENDED into a stored
   * snapshot, no process): record and snapshot stay for the next host. False otherwise.
   */
  leave(): Promise<boolean>;
}

/** Launches the instance and creates its record; undefined when the id's record exists already. */
export async function launchHosted(options: HostedOptions): Promise<HostedInstance | undefined> {
  let hosted: HostedInstance | undefined;
  let created = false;
  let terminalAt: string | undefined;
  let finished!: () => void;
  const gone = new Promise<void>((resolve) => (finished = resolve));

  const keeper =
    options.snapshots &&
    snapshotKeeper({
      ...options.snapshots,
      provider: options.provider,
      owner: options.owner,
      microvmId: options.microvmId,
      stored: options.adopt !== undefined,
    });
  const instance = await launchMicrovmInstance({
    microvmId: options.microvmId,
    image: options.image,
    imageIdentifier: options.imageIdentifier,
    idlePolicy: options.idlePolicy,
    provider: options.provider,
    tokenKey: options.tokenKey,
    ...(options.tokenRevoked ? { tokenRevoked: options.tokenRevoked } : {}),
    proxy: { host: options.proxyBindHost },
    ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
    ...(keeper ? { snapshots: keeper } : {}),
    ...(options.adopt ? { persisted: options.adopt.record.snapshot } : {}),
    onSnapshot: () => hosted && changed(),
  });
  const endpoint = `${options.proxyHost}:${instance.endpoint.slice(instance.endpoint.lastIndexOf(":") + 1)}`;

  const current = (): MicrovmRecord => {
    const snapshot = instance.actor.getSnapshot();
    const state = microvmState(snapshot);
    if (isTerminal(state)) terminalAt ??= new Date().toISOString();
    const { context } = snapshot;
    return {
      microvmId: options.microvmId,
      owner: options.owner,
      imageIdentifier: options.imageIdentifier,
      ...(options.imageDigest === undefined ? {} : { imageDigest: options.imageDigest }),
      state,
      ...(context.stateReason === undefined ? {} : { stateReason: context.stateReason }),
      endpoint,
      idlePolicy: options.idlePolicy,
      startedAt: context.startedAt,
      hostId: options.hostId,
      ...(context.handle ? { handle: storedHandle(context.handle) } : {}),
      ...(context.saved ? { checkpoint: context.saved } : {}),
      snapshot: withoutSecrets(instance.actor.getPersistedSnapshot()),
      updatedAt: new Date().toISOString(),
      ...(terminalAt === undefined ? {} : { terminalAt }),
    };
  };
  const currentSignature = () => {
    const snapshot = instance.actor.getSnapshot();
    return recordSignature(microvmState(snapshot), snapshot.context.stateReason, snapshot.context.handle?.pid);
  };
  const writer = new RecordWriter({
    store: options.store,
    current,
    currentSignature,
    onTakenOver: (stored) => {
      hosted?.disown();
      log.warn(
        { microvmId: options.microvmId, state: stored.state, stateReason: stored.stateReason },
        "microvm record ended elsewhere; terminating",
      );
      instance.send({ type: "TERMINATE", reason: storedReason(stored.stateReason) });
    },
  });

  let cleaning = false;
  let disowned = false;
  const cleanUp = async () => {
    cleaning = true;
    if (created) await writer.flush();
    const handle = instance.actor.getSnapshot().context.handle;
    instance.actor.stop();
    await instance.proxy.close();
    // FAILED keeps its handle: a process that failed to suspend or resume may still be there.
    if (handle)
      await options.provider.terminate(handle, 500).catch((err: unknown) => log.warn({ err }, "kill after FAILED"));
    // An ended instance never runs again: its snapshot (if any) goes, and frees its owner's quota.
    // One whose record another host took keeps it (an expired record's sweep deletes it else),
    // but not this host's image of it.
    await (disowned ? keeper?.release() : keeper?.discard())?.catch((err: unknown) =>
      log.warn({ err, microvmId: options.microvmId }, "deleting a snapshot failed"),
    );
    options.onGone(hosted!);
    finished();
  };
  const changed = () => {
    writer.changed();
    if (!cleaning && isTerminal(microvmState(instance.actor.getSnapshot()))) void cleanUp();
  };

  hosted = {
    microvmId: options.microvmId,
    endpoint,
    instance,
    writer,
    state: () => microvmState(instance.actor.getSnapshot()),
    async settle(states, timeoutMs) {
      try {
        return await instance.waitForState(states, timeoutMs);
      } catch {
        return microvmState(instance.actor.getSnapshot());
      }
    },
    gone,
    disown: () => void (disowned = true),
    async leave() {
      const snapshot = instance.actor.getSnapshot();
      if (cleaning || !snapshot.matches({ SUSPENDED: "asleep" }) || snapshot.context.saved === undefined) return false;
      cleaning = true;
      await writer.flush();
      writer.close();
      await instance.close({ terminate: false });
      options.onGone(hosted!);
      finished();
      return true;
    },
  };
  if (options.adopt) {
    // Claimed at the revision it was read at: of two hosts adopting it, one wins.
    const revision = await options.store.replace(current(), options.adopt.revision).catch(() => undefined);
    if (revision === undefined) {
      // Another host took it: this copy ends without a word to the record or the snapshot.
      writer.close();
      cleaning = true;
      await instance.close();
      return undefined;
    }
    writer.adopt(revision);
    created = true;
    return hosted;
  }
  created = await writer.create().catch((err: unknown) => {
    instance.send({ type: "TERMINATE" });
    throw err;
  });
  if (!created) {
    instance.send({ type: "TERMINATE", reason: StateReason.DuplicateRun });
    return undefined;
  }
  changed();
  return hosted;
}

/** The handle without `upstreamHeaders` (the per-instance secret only the proxy may send). */
function storedHandle(handle: MicrovmHandle): StoredHandle {
  return {
    provider: handle.provider,
    host: handle.host,
    ports: handle.ports,
    ...(handle.pid === undefined ? {} : { pid: handle.pid }),
    ...(handle.pidStartTime === undefined ? {} : { pidStartTime: handle.pidStartTime }),
    startedAt: handle.startedAt,
  };
}

/** The persisted snapshot without secrets: handles appear in context and in invoked actors' input. */
function withoutSecrets(persisted: unknown): unknown {
  return JSON.parse(
    JSON.stringify(persisted, (key, value: unknown) => (key === "upstreamHeaders" ? undefined : value)),
  );
}

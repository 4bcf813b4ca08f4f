// Leases and activations of owned keys (task objects; any kind of object held by one process at
// a time, each with its own `Placement`): each has at most one live activation across all actor
// processes. A task object is its lease key (`taskObjectLeaseKey`: `<name-token>`, owned
// `=<owner>.<name-token>`, in the bucket `leaseBucketFor` names); a process activates it by
// claiming that key with a compare-and-set on the key's revision; it renews the
// lease by heartbeat and fences every write (a renewal before it, or a condition on the lease's
// revision carried by the write itself), releases it when the name goes idle or the process
// stops, and stops serving the name the moment its lease could have lapsed.
import { performance } from "node:perf_hooks";
import { TaskObjectBusy, taskObjectName } from "../schemas/index.ts";
import { CONFLICT, log, recordBusy, recordQueueDepth, setActivations, type VersionedStore } from "../platform/index.ts";
import { Mailboxes } from "./mailbox.ts";

/**
 * The lease key's value: who holds the name, for how long after each renewal, and since when
 * (epoch ms on the holder's clock, when its activation claimed the name; absent from leases
 * written before it was added).
 */
export interface LeaseValue {
  owner: string;
  ttlMs: number;
  since?: number;
}

/**
 * One activation's start or end, with the lease revision it claimed (its identity); with
 * `logWrites`, also each write it lets out (`write`: the moment after its fence).
 */
export interface ActivationEvent {
  event: "start" | "end" | "write";
  /** The task object's name (its principal's: `key` tells two principals' apart). */
  name: string;
  /** The task object's lease key. */
  key: string;
  owner: string;
  revision: number;
  /** Epoch ms: when it started, the last moment it could serve, or when a write left. */
  at: number;
  reason?: "released" | "expired" | "lost" | "closed";
}

export interface PlacementOptions {
  /** Unique per process start: the owner written in leases and used in owner subjects. */
  ownerId: string;
  leases: VersionedStore;
  /** A lease lapses this long after the holder sent its last successful renewal (default 2 s). */
  ttlMs?: number;
  /** Renewal period of a held lease (default a third of the TTL). */
  renewMs?: number;
  /** A name with no request for this long is released (default 30 s). */
  idleMs?: number;
  /** Added to the holder's TTL before a silent lease is taken over (default 500 ms). */
  marginMs?: number;
  onActivation?: (event: ActivationEvent) => void;
  /** Also report every write as an event (an audit trail; off by default: one line per write). */
  logWrites?: boolean;
  /**
   * Requests one name may have waiting or running here; one more is refused at once with 429
   * TaskObjectBusy (default 256), instead of queueing until it times out.
   */
  maxPending?: number;
  /**
   * The refusal of a request past `maxPending` (default 429 TaskObjectBusy): each kind of owned thing names its own.
   */
  busy?: (name: string, pending: number) => Error;
  /** Where activations, queue depths and refusals are counted (default: the task objects' metrics). */
  metrics?: PlacementMetrics;
}

/** The metrics a placement reports to. */
export interface PlacementMetrics {
  activations(count: number): void;
  queueDepth(depth: number): void;
  busy(): void;
}

const taskObjectMetrics: PlacementMetrics = {
  activations: setActivations,
  queueDepth: recordQueueDepth,
  busy: recordBusy,
};

/** A name held by another process, as last read here. */
interface Sighting {
  owner: string;
  revision: number;
  /** When this process first saw that revision (monotonic ms). */
  seenAt: number;
  ttlMs: number;
}

/** Where a name's requests go now. */
export type Route =
  | { kind: "local"; activation: Activation }
  | { kind: "remote"; owner: string }
  | { kind: "wait"; until: number };

/** The activation this request ran in ended first: route the request again. */
export class LeaseLost extends Error {
  override readonly name = "LeaseLost";
}

/** Epoch ms of a `performance.now()` instant, read off the shared system clock. */
const epochOf = (mono: number) => Date.now() - (performance.now() - mono);

/** A held lease: this process serves the name until `deadline` (monotonic ms). */
export class Activation {
  /** Current revision of the lease key (moves with every renewal and fence). */
  revision: number;
  /** When the last successful renewal (or the claim) was sent (monotonic ms). */
  lastRenewal: number;
  lastUsed = performance.now();
  /** Requests routed here and not finished (queued in the mailbox or running). */
  pending = 0;
  /** Kept however long it is idle: its holder releases it itself (`Placement.release`). */
  pinned = false;
  ended = false;
  /** Why it ended, once it did. */
  endReason: NonNullable<ActivationEvent["reason"]> | undefined;
  renewing = false;
  renewFailures = 0;
  /** The next fence's compare-and-set while it is not yet sent: fences asked for meanwhile join it. */
  nextFence: Promise<void> | undefined;
  /**
   * The last write of the lease key failed without an answer (a timeout): the server may have
   * applied it, moving the key past `revision` with this activation's own value.
   */
  unanswered = false;
  #casChain: Promise<unknown> = Promise.resolve();
  #leaseWrites = 0;

  /** The task object's name (for people: two principals' objects may share it). */
  readonly name: string;

  constructor(
    /** The task object: its lease key. */
    readonly key: string,
    /** The revision this activation's claim wrote: its identity in logs. */
    readonly claimRevision: number,
    sentAt: number,
    readonly ttlMs: number,
    /** What its claim and every renewal write in the lease key (a `LeaseValue`). */
    readonly value: string,
  ) {
    this.name = taskObjectName(key);
    this.revision = claimRevision;
    this.lastRenewal = sentAt;
  }

  /** The lease may lapse from here on (monotonic ms). */
  get deadline(): number {
    return this.lastRenewal + this.ttlMs;
  }

  /** Serves only while the lease cannot have lapsed, with room for one write to leave. */
  get live(): boolean {
    return !this.ended && performance.now() < this.deadline - GUARD_MS;
  }

  /** Runs compare-and-set writes of this lease one after another (a renewal never races a fence). */
  serialize<T>(write: () => Promise<T>): Promise<T> {
    this.#leaseWrites++;
    const next = this.#casChain.then(write, write).finally(() => this.#leaseWrites--);
    this.#casChain = next.catch(() => undefined);
    return next;
  }

  /** A write of the lease key is queued or in flight: the revision it will leave is not known yet. */
  get leaseWriting(): boolean {
    return this.#leaseWrites > 0;
  }

  /** Settles once the lease writes queued so far have. */
  leaseWritten(): Promise<unknown> {
    return this.#casChain;
  }
}

/** Requests one name may have waiting or running in its activation (`TASK_OBJECT_MAX_PENDING`). */
export const DEFAULT_MAX_PENDING = 256;
/** The wait a TaskObjectBusy names: a full queue of fast requests drains well within it. */
const BUSY_RETRY_SECONDS = 1;

const taskObjectBusy = (name: string, pending: number) =>
  TaskObjectBusy.make({
    name,
    retryAfterSeconds: BUSY_RETRY_SECONDS,
    message: `task object "${name}" has ${pending} requests waiting, its most: try again in ${BUSY_RETRY_SECONDS} s`,
  });

// Time kept between the last serving moment and the lease's end, for a write to leave.
const GUARD_MS = 100;
const MAX_REMEMBERED = 100_000;
// Pause before a closing process reads a lease again.
const RETRY_MS = 100;
// Pause after a refused claim before the lease is read again.
const CLAIM_RETRY_MS = 50;
// Lease writes a write carrying its fence waits out before it is fenced the usual way instead.
const MAX_FENCE_WAITS = 2;

export class Placement {
  readonly ownerId: string;
  readonly #leases: VersionedStore;
  readonly #ttlMs: number;
  readonly #renewMs: number;
  readonly #idleMs: number;
  readonly #marginMs: number;
  readonly #onActivation?: (event: ActivationEvent) => void;
  readonly #logWrites: boolean;
  readonly #maxPending: number;
  readonly #busy: (name: string, pending: number) => Error;
  readonly #metrics: PlacementMetrics;
  readonly #mailboxes = new Mailboxes();
  readonly #active = new Map<string, Activation>();
  readonly #elsewhere = new Map<string, Sighting>();
  readonly #resolving = new Map<string, Promise<Route>>();
  /** Takeovers due when a silent owner's lease may be claimed, by lease key. */
  readonly #takeovers = new Map<string, NodeJS.Timeout>();
  readonly #timer: NodeJS.Timeout;
  #closed = false;

  constructor(options: PlacementOptions) {
    this.ownerId = options.ownerId;
    this.#leases = options.leases;
    this.#ttlMs = options.ttlMs ?? 2_000;
    this.#renewMs = options.renewMs ?? Math.floor(this.#ttlMs / 3);
    this.#idleMs = options.idleMs ?? 30_000;
    this.#marginMs = options.marginMs ?? 500;
    this.#onActivation = options.onActivation;
    this.#logWrites = options.logWrites ?? false;
    this.#maxPending = options.maxPending ?? DEFAULT_MAX_PENDING;
    this.#busy = options.busy ?? taskObjectBusy;
    this.#metrics = options.metrics ?? taskObjectMetrics;
    this.#timer = setInterval(() => this.#tick(), Math.min(250, Math.floor(this.#renewMs / 2))).unref();
  }

  /** Names this process holds now. */
  get activations(): number {
    return this.#active.size;
  }

  /**
   * Where the requests of the task object whose lease key is `key` go. `suspect` names an owner
   * a forward to just failed: the lease
   * is read again, and taken over once it has not moved for the holder's TTL plus the margin.
   */
  route(key: string, suspect?: string): Route | Promise<Route> {
    const activation = this.#active.get(key);
    if (activation?.live) return { kind: "local", activation };
    const known = this.#elsewhere.get(key);
    if (known && known.owner !== suspect && !activation && !this.#resolving.has(key))
      return { kind: "remote", owner: known.owner };
    let resolving = this.#resolving.get(key);
    if (!resolving) {
      resolving = this.#resolve(key, suspect).finally(() => this.#resolving.delete(key));
      this.#resolving.set(key, resolving);
    }
    return resolving;
  }

  /** Drops what this process believed about the owner of `key`'s object (it said it is not). */
  forget(key: string): void {
    this.#elsewhere.delete(key);
  }

  /**
   * Runs `work` in `activation`; refuses once the lease may have lapsed. Exclusive work (the
   * default) runs after the name's earlier exclusive work; work that commutes with the rest
   * (`exclusive: false`) starts at once, so its fences can share one compare-and-set.
   */
  async run<T>(
    activation: Activation,
    work: (activation: Activation) => Promise<T>,
    { exclusive = true } = {},
  ): Promise<T> {
    this.#metrics.queueDepth(activation.pending);
    if (activation.pending >= this.#maxPending) {
      this.#metrics.busy();
      throw this.#busy(activation.name, activation.pending);
    }
    activation.pending++;
    const guarded = async () => {
      if (!activation.live) throw new LeaseLost(activation.name);
      activation.lastUsed = performance.now();
      const result = await work(activation);
      // An answer computed past the lease is not given: the next owner may have moved on.
      if (!activation.live) throw new LeaseLost(activation.name);
      return result;
    };
    try {
      return await (exclusive ? this.#mailboxes.run(activation.key, guarded) : guarded());
    } finally {
      activation.pending--;
      activation.lastUsed = performance.now();
    }
  }

  /**
   * The fence before a write: renews the lease at the revision this activation holds. A
   * process whose lease was taken over (e.g. it was paused past it) fails here and writes nothing.
   * Group commit: one compare-and-set serves every fence asked for before it was sent, so
   * each write still leaves after a renewal that began after the write was asked for.
   */
  async fence(activation: Activation): Promise<void> {
    activation.nextFence ??= this.#renew(activation, () => (activation.nextFence = undefined));
    await activation.nextFence;
    if (!activation.live) throw new LeaseLost(activation.name);
    this.#logWrite(activation);
  }

  /**
   * A write that carries its own fence: `write(revision)` must send a write the server stores
   * only while the lease key is still at `revision`, this activation's. It is sent once no
   * renewal or fence of the lease is queued or in flight (their revision is not known until
   * answered), in the same turn as the check that the activation is live; a renewal asked for
   * after it leaves after it, on the same connection, so it does not overtake it. Costs no
   * lease write: a process whose lease was taken over has the write refused by the server,
   * however late it arrives. "busy" (nothing sent) when lease writes kept coming (the name's
   * other writes' fences): the caller then fences as they do.
   */
  async carryingFence<T>(activation: Activation, write: (revision: number) => Promise<T>): Promise<T | "busy"> {
    for (let waits = 0; activation.leaseWriting; waits++) {
      if (waits === MAX_FENCE_WAITS) return "busy";
      await activation.leaseWritten();
    }
    if (!activation.live) throw new LeaseLost(activation.name);
    this.#logWrite(activation);
    return write(activation.revision);
  }

  #logWrite(activation: Activation): void {
    if (!this.#logWrites) return;
    this.#emit({
      event: "write",
      name: activation.name,
      key: activation.key,
      owner: this.ownerId,
      revision: activation.claimRevision,
      at: Date.now(),
    });
  }

  /**
   * Ends `activation` and deletes its lease at once, so another process may claim the key (a
   * holder that evicts what it keeps on its own schedule rather than after `idleMs`).
   */
  async release(activation: Activation): Promise<void> {
    // Ended by its local deadline (renewals late on a loaded host), the key may still hold its
    // lease: deleted at its revision all the same (refused if another process claimed it since).
    if (activation.ended && activation.endReason !== "expired") return;
    await this.#release(activation, "released");
  }

  /**
   * Claims nothing more, lets the requests routed here finish (up to `graceMs`), then releases
   * every held name so other processes take them over at once.
   */
  async close(graceMs = 5_000): Promise<void> {
    this.#closed = true;
    const until = performance.now() + graceMs;
    while ([...this.#active.values()].some((a) => a.pending > 0) && performance.now() < until) {
      await new Promise((r) => setTimeout(r, 20));
    }
    clearInterval(this.#timer);
    for (const timer of this.#takeovers.values()) clearTimeout(timer);
    this.#takeovers.clear();
    await Promise.allSettled([...this.#active.values()].map((a) => this.#release(a, "closed")));
  }

  async #resolve(key: string, suspect: string | undefined): Promise<Route> {
    const held = this.#active.get(key);
    if (held?.live) return { kind: "local", activation: held };
    if (held) this.#end(held, "expired");
    const entry = await this.#leases.get(key);
    const seenAt = performance.now();
    const lease = entry.value ? parseLease(entry.value) : undefined;
    // Free, deleted, unreadable, or this process's own from an earlier activation: claim it
    // (a closing process claims nothing; its callers retry until another process has).
    if (!lease || lease.owner === this.ownerId) {
      return this.#closed ? { kind: "wait", until: seenAt + RETRY_MS } : this.#claim(key, entry.revision);
    }
    let known = this.#elsewhere.get(key);
    // The suspect renewed since a sighting less than a TTL old: slow, not silent; try it again.
    const renewedLately =
      known?.owner === lease.owner && known.revision !== entry.revision && seenAt - known.seenAt < known.ttlMs;
    if (!known || known.revision !== entry.revision || known.owner !== lease.owner) {
      known = { owner: lease.owner, revision: entry.revision, seenAt, ttlMs: lease.ttlMs };
      this.#remember(key, known);
    }
    if (lease.owner !== suspect || renewedLately) return { kind: "remote", owner: lease.owner };
    // The owner did not answer. The lease is only taken once it has not moved for longer than
    // its holder's TTL: by then the holder has stopped serving, whatever happened to it.
    const claimableAt = known.seenAt + known.ttlMs + this.#marginMs;
    if (this.#closed) return { kind: "wait", until: Math.max(claimableAt, seenAt + RETRY_MS) };
    if (seenAt < claimableAt) {
      this.#scheduleTakeover(key, suspect, claimableAt);
      return { kind: "wait", until: claimableAt };
    }
    return this.#claim(key, entry.revision);
  }

  /**
   * Claims a silent owner's name when its lease may be taken, even if the requests that found
   * it silent have given up by then: the next request, wherever it enters, finds it placed.
   */
  #scheduleTakeover(key: string, suspect: string, at: number): void {
    if (this.#takeovers.has(key)) return;
    const timer = setTimeout(
      () => {
        this.#takeovers.delete(key);
        if (this.#closed) return;
        Promise.resolve(this.route(key, suspect)).catch((err: unknown) =>
          log.warn({ name: taskObjectName(key), err: (err as Error).name }, "task-object takeover failed"),
        );
      },
      Math.max(0, at - performance.now()) + 1,
    ).unref();
    this.#takeovers.set(key, timer);
  }

  async #claim(key: string, revision: number): Promise<Route> {
    const sentAt = performance.now();
    const value = JSON.stringify({ owner: this.ownerId, ttlMs: this.#ttlMs, since: Date.now() } satisfies LeaseValue);
    const written = await this.#leases.put(key, value, revision);
    if (written === CONFLICT) {
      this.#elsewhere.delete(key);
      // Someone else moved first, or the stream leader still holds an earlier write of the key
      // in flight (a leader cut off from its peers holds one until it steps down, refusing every
      // write of the key meanwhile): read again after a pause, so a refused key is not hammered.
      return { kind: "wait", until: performance.now() + CLAIM_RETRY_MS };
    }
    const activation = new Activation(key, written, sentAt, this.#ttlMs, value);
    this.#elsewhere.delete(key);
    this.#active.set(key, activation);
    this.#metrics.activations(this.#active.size);
    this.#emit({ event: "start", name: activation.name, key, owner: this.ownerId, revision: written, at: Date.now() });
    return { kind: "local", activation };
  }

  /** `onSend`: called when this renewal's turn comes, just before it checks and writes. */
  #renew(activation: Activation, onSend?: () => void): Promise<void> {
    return activation.serialize(async () => {
      onSend?.();
      if (!activation.live) throw new LeaseLost(activation.name);
      const sentAt = performance.now();
      let written = await this.#leaseWrite(activation, () =>
        this.#leases.put(activation.key, activation.value, activation.revision),
      );
      // A renewal whose answer was lost (it timed out, yet the server applied it) moved the key
      // with this activation's own value: still held, renewed again at the revision it left.
      const moved = written === CONFLICT ? await this.#ownRevision(activation) : undefined;
      if (moved !== undefined)
        written = await this.#leaseWrite(activation, () => this.#leases.put(activation.key, activation.value, moved));
      if (written === CONFLICT) {
        this.#end(activation, "lost");
        throw new LeaseLost(activation.name);
      }
      activation.revision = written;
      activation.lastRenewal = sentAt;
    });
  }

  /** Ends the activation first (nothing more is served), then deletes the key at its revision. */
  async #release(activation: Activation, reason: "released" | "closed"): Promise<void> {
    this.#end(activation, reason);
    await activation.serialize(async () => {
      let deleted = await this.#leaseWrite(activation, () => this.#leases.delete(activation.key, activation.revision));
      // Moved by a renewal of its own whose answer was lost: deleted at the revision that left.
      const moved = deleted === CONFLICT ? await this.#ownRevision(activation) : undefined;
      if (moved !== undefined) deleted = await this.#leases.delete(activation.key, moved);
      // Past its deadline another process may have claimed it: that refusal is no news.
      if (deleted === CONFLICT && activation.endReason !== "expired")
        log.warn({ name: activation.name }, "task-object lease moved before its release");
    });
  }

  /** A write of the lease key, noting whether it went unanswered (`Activation.unanswered`). */
  async #leaseWrite(activation: Activation, write: () => Promise<number | typeof CONFLICT>) {
    try {
      const written = await write();
      // A refusal leaves the question open: the refused write's key may hold what went unanswered.
      if (written !== CONFLICT) activation.unanswered = false;
      return written;
    } catch (err) {
      activation.unanswered = true;
      throw err;
    }
  }

  /**
   * After a refused write: the key's revision when an unanswered write of this activation left
   * it holding this very activation's lease value (its owner and claim time: no other activation
   * writes it), else undefined: someone else moved it (read only after an unanswered write).
   */
  async #ownRevision(activation: Activation): Promise<number | undefined> {
    if (!activation.unanswered) return undefined;
    const entry = await this.#leases.get(activation.key);
    const value = entry.value === undefined ? undefined : Buffer.from(entry.value).toString("utf8");
    return value === activation.value && entry.revision !== activation.revision ? entry.revision : undefined;
  }

  #end(activation: Activation, reason: NonNullable<ActivationEvent["reason"]>): void {
    if (activation.ended) return;
    activation.ended = true;
    activation.endReason = reason;
    if (this.#active.get(activation.key) === activation) this.#active.delete(activation.key);
    this.#metrics.activations(this.#active.size);
    const lastServing = Math.min(performance.now(), activation.deadline);
    this.#emit({
      event: "end",
      name: activation.name,
      key: activation.key,
      owner: this.ownerId,
      revision: activation.claimRevision,
      at: Math.floor(epochOf(lastServing)),
      reason,
    });
  }

  #tick(): void {
    const now = performance.now();
    for (const activation of this.#active.values()) {
      if (now >= activation.deadline - GUARD_MS) {
        this.#end(activation, "expired");
      } else if (
        activation.pending === 0 &&
        !activation.pinned &&
        now - activation.lastUsed >= this.#idleMs &&
        !this.#resolving.has(activation.key)
      ) {
        const release = this.#release(activation, "released")
          .catch((err: unknown) =>
            log.warn({ name: activation.name, err: (err as Error).name }, "task-object lease release failed"),
          )
          .then((): Route => ({ kind: "wait", until: performance.now() }));
        this.#resolving.set(
          activation.key,
          release.finally(() => this.#resolving.delete(activation.key)),
        );
      } else if (now - activation.lastRenewal >= this.#renewMs && !activation.renewing) {
        activation.renewing = true;
        this.#renew(activation)
          .then(() => (activation.renewFailures = 0))
          .catch((err: unknown) => {
            // Once per outage: the lease lapses on its own if renewals keep failing.
            if (!(err instanceof LeaseLost) && activation.renewFailures++ === 0) {
              log.warn({ name: activation.name, err: (err as Error).name }, "task-object lease renewal failed");
            }
          })
          .finally(() => (activation.renewing = false));
      }
    }
  }

  #remember(key: string, known: Sighting): void {
    this.#elsewhere.delete(key);
    this.#elsewhere.set(key, known);
    if (this.#elsewhere.size > MAX_REMEMBERED) this.#elsewhere.delete(this.#elsewhere.keys().next().value!);
  }

  #emit(event: ActivationEvent): void {
    try {
      this.#onActivation?.(event);
    } catch (err) {
      log.error({ err }, "activation listener failed");
    }
  }
}

/** The owner id a lease key's value names, if it is a lease. */
export function leaseOwner(data: Uint8Array | undefined): string | undefined {
  return data ? parseLease(data)?.owner : undefined;
}

/** A lease key's value, or undefined when it is not a lease. */
export function parseLease(data: Uint8Array): LeaseValue | undefined {
  try {
    const value = JSON.parse(Buffer.from(data).toString("utf8")) as Partial<LeaseValue>;
    if (typeof value.owner !== "string" || typeof value.ttlMs !== "number") return undefined;
    const since = typeof value.since === "number" && Number.isFinite(value.since) ? { since: value.since } : {};
    return { owner: value.owner, ttlMs: value.ttlMs, ...since };
  } catch {
    return undefined;
  }
}

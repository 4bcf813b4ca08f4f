// Instance logs: every line an instance writes (stdout, stderr; already bounded in length and
// rate by its host) goes into the JetStream stream `MICROVM_LOGS`, on one subject per owner
// and instance (`microvmlogs.<owner token>.<id token>`), so they outlive the instance and its
// host until their age limit. The stream keeps the latest lines of each instance, for at most
// an age, within an overall size. Reads are direct gets, so any host answers them and no
// consumer is made; only the owner's subject is ever read, so another principal sees none.
import { jetstreamManager, type JetStreamManager, type StoredMsg } from "@nats-io/jetstream";
import { headers, type MsgHdrs, type NatsConnection } from "@nats-io/transport-node";
import {
  ensureStreamSettings,
  type HeldRequests,
  instanceLogStream,
  instanceLogSubjects,
  log,
  provisionedStream,
} from "../../platform/index.ts";
import { DEFAULT_LOG_LINES, nameToken } from "../../schemas/index.ts";

/** Defaults of the stream's limits (`MICROVM_LOG_LINES`, `MICROVM_LOG_MAX_AGE_SECONDS`, `MICROVM_LOG_STORE_MIB`). */
export const DEFAULT_LOG_LIMITS = { linesPerInstance: 1000, maxAgeSeconds: 86_400, storeMiB: 256 } as const;

export interface InstanceLogOptions {
  readonly replicas?: number;
  /** Lines kept per instance: the oldest go first (`max_msgs_per_subject`). */
  readonly linesPerInstance?: number;
  /** Age after which a line goes (`max_age`). */
  readonly maxAgeSeconds?: number;
  /** Size of the whole stream (`max_bytes`): past it, the oldest lines of any instance go. */
  readonly storeMiB?: number;
}

/** One stored line, as GetMicrovmLogs answers it. */
export interface LogLine {
  readonly time: string;
  readonly stream: "stdout" | "stderr";
  readonly line: string;
}

export interface LogPage {
  readonly items: LogLine[];
  /** The stream sequence of the last line answered (or `since`): the next read's `since`. */
  readonly cursor: string;
}

const STREAM_HEADER = "Microvm-Stream";
/** Lines read per direct-get batch while walking an instance's subject. */
const BATCH = 500;

const subjectOf = (owner: string, microvmId: string) =>
  `${instanceLogSubjects.slice(0, -1)}${nameToken(owner)}.${nameToken(microvmId)}`;

/** A log read's query, as the operations that read logs take it (`LogQuery`). */
export interface LogReadInput {
  readonly limit?: number | string;
  readonly since?: string;
  readonly waitSeconds?: number | string;
}

/**
 * Answers a read of `owner`'s lines stored as `id`: a line there proves them the caller's, else
 * `owned` must (it rejects with the operation's 404). A read that asks to wait is held until a
 * line comes, the wait ends, or the gateway says its HTTP client left.
 */
export async function answerLogRead(
  logs: Pick<InstanceLogs, "read" | "has">,
  held: Pick<HeldRequests, "hold">,
  request: { readonly owner: string; readonly id: string; readonly headers: MsgHdrs | undefined },
  input: LogReadInput,
  owned: () => Promise<unknown>,
): Promise<LogPage> {
  const { owner, id } = request;
  const since = input.since === undefined ? undefined : Number(input.since);
  const read = {
    ...(input.limit === undefined ? {} : { limit: Number(input.limit) }),
    ...(since === undefined ? {} : { since }),
  };
  const mustOwn = async () => {
    if (!(await logs.has(owner, id))) await owned();
  };
  if (since !== undefined && input.waitSeconds !== undefined) {
    const waitMs = Number(input.waitSeconds) * 1000;
    return held.hold(request.headers, async (signal) => {
      await mustOwn();
      return logs.read(owner, id, { ...read, waitMs, ...(signal ? { signal } : {}) });
    });
  }
  const page = await logs.read(owner, id, read);
  if (page.items.length === 0) await mustOwn();
  return page;
}

export class InstanceLogs {
  /** The owner of each instance whose output this host stores, and how many launches keep it. */
  readonly #owners = new Map<string, { owner: string; storedAs: string; keeps: number }>();
  #waiting = 0;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly jsm: JetStreamManager,
  ) {}

  /**
   * Stores the output of `owner`'s instance from now on, as the lines of `storedAs` (default:
   * the instance's own id; an object's activations store theirs under the object's); the
   * returned function stops it (once).
   */
  keep(microvmId: string, owner: string, storedAs = microvmId): () => void {
    const kept = this.#owners.get(microvmId);
    if (kept?.owner === owner && kept.storedAs === storedAs) kept.keeps += 1;
    else this.#owners.set(microvmId, { owner, storedAs, keeps: 1 });
    let done = false;
    return () => {
      const current = this.#owners.get(microvmId);
      if (done || current?.owner !== owner) return;
      done = true;
      current.keeps -= 1;
      if (current.keeps === 0) this.#owners.delete(microvmId);
    };
  }

  /**
   * The provider's output sink: a line of an instance kept here is stored; any other (a wall
   * booted ahead, an image push's check) goes to this host's debug log only.
   */
  readonly sink = (microvmId: string, stream: "stdout" | "stderr", line: string): void => {
    const kept = this.#owners.get(microvmId);
    if (kept === undefined) log.debug({ microvmId, stream, line }, "instance output");
    else this.write(kept.owner, kept.storedAs, stream, line);
  };

  /** True when `owner`'s instance has a stored line. */
  async has(owner: string, microvmId: string): Promise<boolean> {
    const last = await this.jsm.direct
      .getMessage(instanceLogStream, { last_by_subj: subjectOf(owner, microvmId) })
      .catch(() => null);
    return last !== null;
  }

  /** Creates the stream, or brings an existing one to these limits (the provisioning credential's work). */
  static async provision(nc: NatsConnection, options: InstanceLogOptions = {}): Promise<void> {
    const jsm = await jetstreamManager(nc, { checkAPI: false });
    const limits = {
      max_msgs_per_subject: options.linesPerInstance ?? DEFAULT_LOG_LIMITS.linesPerInstance,
      max_age: (options.maxAgeSeconds ?? DEFAULT_LOG_LIMITS.maxAgeSeconds) * 1_000_000_000,
      max_bytes: (options.storeMiB ?? DEFAULT_LOG_LIMITS.storeMiB) * 1024 * 1024,
    };
    try {
      await jsm.streams.add({
        name: instanceLogStream,
        subjects: [instanceLogSubjects],
        num_replicas: options.replicas ?? 1,
        allow_direct: true,
        ...limits,
      });
    } catch (err) {
      // It exists (made by an earlier start, or with other limits): take these limits.
      if (!(await jsm.streams.info(instanceLogStream).catch(() => undefined))) throw err;
      await ensureStreamSettings(nc, instanceLogStream, limits);
    }
  }

  /** Opens the stream as it is (`StoreNotProvisioned` when it is missing). */
  static async open(nc: NatsConnection): Promise<InstanceLogs> {
    await provisionedStream(nc, instanceLogStream);
    return new InstanceLogs(nc, await jetstreamManager(nc, { checkAPI: false }));
  }

  /**
   * Stores one line of `owner`'s instance: a core publish the stream captures, so a flood costs
   * the host no round trip. Lines written while NATS is unreachable are lost (counted in the log).
   */
  write(owner: string, microvmId: string, stream: "stdout" | "stderr", line: string): void {
    const h = headers();
    h.set(STREAM_HEADER, stream);
    try {
      this.nc.publish(subjectOf(owner, microvmId), line, { headers: h });
    } catch (err) {
      log.debug({ err, microvmId }, "an instance log line was not stored");
    }
  }

  /** Reads waiting for a line now (each holds a subscription): `microvm_log_waits`. */
  get waiting(): number {
    return this.#waiting;
  }

  /**
   * `owner`'s lines of the instance: the `limit` latest (without `since`), or the first `limit`
   * after the line at sequence `since`; with `waitMs`, a read after `since` that finds none waits
   * that long for one, or until `signal` aborts (its caller left: the page is then empty).
   * Empty when the instance wrote nothing (or is not the owner's).
   */
  async read(
    owner: string,
    microvmId: string,
    options: { limit?: number; since?: number; waitMs?: number; signal?: AbortSignal } = {},
  ): Promise<LogPage> {
    const subject = subjectOf(owner, microvmId);
    const limit = options.limit ?? DEFAULT_LOG_LINES;
    if (options.since === undefined) return this.latest(subject, limit);
    const { since, signal } = options;
    if (!options.waitMs || signal?.aborted) return this.after(subject, since, limit);
    // Subscribed before the read, so a line stored between the two still wakes the wait.
    const sub = this.nc.subscribe(subject, { max: 1 });
    const stop = () => sub.unsubscribe();
    const timer = setTimeout(stop, options.waitMs);
    signal?.addEventListener("abort", stop, { once: true });
    this.#waiting += 1;
    try {
      const page = await this.after(subject, since, limit);
      if (page.items.length > 0) return page;
      for await (const _ of sub) break;
      if (signal?.aborted) return { items: [], cursor: String(since) };
      return await this.after(subject, since, limit);
    } finally {
      this.#waiting -= 1;
      clearTimeout(timer);
      signal?.removeEventListener("abort", stop);
      sub.unsubscribe();
    }
  }

  /** Deletes every line of the instance (e.g. when its owner deletes it for good). */
  async purge(owner: string, microvmId: string): Promise<void> {
    await this.jsm.streams.purge(instanceLogStream, { filter: subjectOf(owner, microvmId) });
  }

  private async after(subject: string, since: number, limit: number): Promise<LogPage> {
    const lines: LogLine[] = [];
    let cursor = since;
    for (const message of await this.batch(subject, since + 1, limit)) {
      lines.push(lineOf(message));
      cursor = message.seq;
    }
    return { items: lines, cursor: String(cursor) };
  }

  /** The last `limit` lines: the subject holds at most `linesPerInstance`, read in batches. */
  private async latest(subject: string, limit: number): Promise<LogPage> {
    const last = await this.jsm.direct.getMessage(instanceLogStream, { last_by_subj: subject }).catch(() => null);
    if (!last) return { items: [], cursor: "0" };
    const kept: StoredMsg[] = [];
    let from = 1;
    for (;;) {
      const batch = await this.batch(subject, from, BATCH);
      for (const message of batch) {
        kept.push(message);
        if (kept.length > limit) kept.shift();
      }
      const end = batch.at(-1)?.seq;
      if (end === undefined || end >= last.seq || batch.length < BATCH) break;
      from = end + 1;
    }
    return { items: kept.map(lineOf), cursor: String(kept.at(-1)?.seq ?? last.seq) };
  }

  private async batch(subject: string, seq: number, batch: number): Promise<StoredMsg[]> {
    const messages: StoredMsg[] = [];
    try {
      const iter = await this.jsm.direct.getBatch(instanceLogStream, { seq, batch, next_by_subj: subject });
      for await (const message of iter) messages.push(message);
    } catch (err) {
      // Nothing at or after `seq` on the subject: an empty batch, not an error.
      if (!isNoMessage(err)) throw err;
    }
    return messages;
  }
}

function lineOf(message: StoredMsg): LogLine {
  return {
    time: message.time.toISOString(),
    stream: message.header.get(STREAM_HEADER) === "stderr" ? "stderr" : "stdout",
    line: message.string(),
  };
}

/** The server's "no message" status (404) for a direct get that found nothing. */
const isNoMessage = (err: unknown) =>
  err instanceof Error && ((err as { code?: unknown }).code === 404 || /message not found/i.test(err.message));

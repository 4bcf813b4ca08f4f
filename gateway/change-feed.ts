// The change feed of the buckets whose reads a gateway keeps: the server republishes every
// write, headers only, on `records.changed.<bucket>.<key>` with the write's stream sequence,
// and each notice drops the kept answers of its record. Core NATS may lose a notice (a
// reconnect, a stream leader's failover), so the feed is checked: a bucket's stream sequences
// come one after another, so a notice past the next one means some were lost; and every
// `checkEveryMs` the stream's last sequence is asked for, which every notice up to it must
// reach within `catchUpMs`, from a leader that heard from a majority of its peers lately. A
// bucket whose notices went missing, or that could not be checked so, is forgotten (its kept
// answers dropped), and a kept answer is sent only while its bucket was confirmed within the bound
// (`LocalReads.confirmed`): a write acknowledged anywhere is seen here within that bound.
import { inTouch, rawHeaders, recordChangesSubject, type NatsHandle, type StreamInfoReply } from "../platform/index.ts";
import type { LocalReads } from "./local-reads.ts";

export interface ChangeFeedOptions {
  /** Bucket names the server republishes writes of (`changeFedBucketNames`). */
  buckets: readonly string[];
  /** How often each bucket's last sequence is asked for (default 250 ms). */
  checkEveryMs?: number;
  /** How long the notices up to that sequence may take to arrive (default 200 ms). */
  catchUpMs?: number;
}

/** Follows the feed and checks it for as long as the connection lives. */
export function followChanges(nats: NatsHandle, prefix: string, reads: LocalReads, options: ChangeFeedOptions): void {
  const root = recordChangesSubject(prefix);
  const checkEveryMs = options.checkEveryMs ?? 250;
  const catchUpMs = options.catchUpMs ?? 200;
  // The highest sequence noticed per bucket; undefined until the bucket's first check.
  const seen = new Map<string, number>();
  nats.nc.subscribe(`${root}.>`, {
    callback: (err, msg) => {
      if (err) return;
      const revision = Number(rawHeaders(msg)?.get("Nats-Sequence"));
      if (!(revision > 0)) return;
      const record = msg.subject.slice(root.length + 1);
      const bucket = record.slice(0, record.indexOf("."));
      const last = seen.get(bucket);
      if (last !== undefined) {
        if (revision > last + 1) reads.forget(bucket);
        if (revision > last) seen.set(bucket, revision);
      }
      reads.written(record, revision);
    },
  });

  const lastSequence = async (bucket: string): Promise<number | undefined> => {
    try {
      const msg = await nats.requester.request(`$JS.API.STREAM.INFO.KV_${bucket}`, undefined, checkEveryMs * 4);
      const info = msg.json<StreamInfoReply>();
      // A leader cut off from its peers answers until it notices, while the others take writes.
      const last = info.state?.last_seq;
      return typeof last === "number" && !info.error && inTouch(info) ? last : undefined;
    } catch {
      return undefined;
    }
  };

  const check = async (bucket: string) => {
    const startedAt = performance.now();
    const last = nats.connected() ? await lastSequence(bucket) : undefined;
    if (last === undefined) return reads.forget(bucket);
    const noticed = seen.get(bucket);
    if (noticed === undefined) {
      // The first check: what was written before the feed was followed is unknown.
      reads.forget(bucket);
    } else if (noticed < last) {
      const until = performance.now() + catchUpMs;
      while ((seen.get(bucket) ?? 0) < last && performance.now() < until) await pause(10);
      if ((seen.get(bucket) ?? 0) < last) reads.forget(bucket);
    }
    if ((seen.get(bucket) ?? 0) < last) seen.set(bucket, last);
    reads.confirmed(bucket, startedAt);
  };

  const loop = async (bucket: string) => {
    while (!nats.nc.isClosed()) {
      const next = performance.now() + checkEveryMs;
      await check(bucket);
      await pause(Math.max(0, next - performance.now()));
    }
  };
  for (const bucket of options.buckets) void loop(bucket);
}

const pause = (ms: number) =>
  new Promise<void>((resolve) => {
    setTimeout(resolve, ms).unref();
  });

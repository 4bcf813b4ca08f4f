// Activation records (start/end lines with the lease revision) and the check that two
// activations of one name never overlap in time.
import type { ActivationEvent } from "../../actors/index.ts";

/** One activation of a name: from its start to the last moment it could serve. */
export interface ActivationInterval {
  name: string;
  owner: string;
  revision: number;
  start: number;
  /** Undefined while it still runs (or when its process died: then `diedAt` bounds it). */
  end?: number;
  reason?: string;
}

/** Pairs start and end events by (owner, name, revision). */
export function activationIntervals(events: readonly ActivationEvent[]): ActivationInterval[] {
  const open = new Map<string, ActivationInterval>();
  const all: ActivationInterval[] = [];
  for (const e of events) {
    const id = `${e.owner}\0${e.name}\0${e.revision}`;
    if (e.event === "write") continue;
    if (e.event === "start") {
      const interval: ActivationInterval = { name: e.name, owner: e.owner, revision: e.revision, start: e.at };
      open.set(id, interval);
      all.push(interval);
    } else {
      const interval = open.get(id);
      if (!interval) throw new Error(`end without start: ${JSON.stringify(e)}`);
      interval.end = e.at;
      interval.reason = e.reason;
      open.delete(id);
    }
  }
  return all;
}

/**
 * Overlaps between activations of the same name, as readable lines (none: []). An interval
 * with no end belongs to a live process (it must be the name's last) or to one killed at
 * `diedAt[owner]`, which ends it.
 */
export function overlaps(
  intervals: readonly ActivationInterval[],
  diedAt: Readonly<Record<string, number>> = {},
): string[] {
  const problems: string[] = [];
  const byName = new Map<string, ActivationInterval[]>();
  for (const i of intervals) byName.set(i.name, [...(byName.get(i.name) ?? []), i]);
  for (const [name, list] of byName) {
    const sorted = [...list].sort((a, b) => a.start - b.start || a.revision - b.revision);
    for (let i = 1; i < sorted.length; i++) {
      const prev = sorted[i - 1]!;
      const next = sorted[i]!;
      const prevEnd = prev.end ?? diedAt[prev.owner];
      if (prevEnd === undefined)
        problems.push(
          `${name}: ${prev.owner}@${prev.revision} never ended, yet ${next.owner}@${next.revision} started at ` +
            `${next.start}`,
        );
      else if (prevEnd > next.start)
        problems.push(
          `${name}: ${prev.owner}@${prev.revision} ran to ${prevEnd}, ${next.owner}@${next.revision} started at ` +
            `${next.start} (${prevEnd - next.start} ms overlap)`,
        );
      if (next.revision <= prev.revision)
        problems.push(`${name}: revision went back from ${prev.revision} to ${next.revision}`);
    }
  }
  return problems;
}

/** Writes that left outside the activation they name (by owner and claim revision). */
export function writesOutside(
  intervals: readonly ActivationInterval[],
  events: readonly ActivationEvent[],
  diedAt: Readonly<Record<string, number>> = {},
): string[] {
  const byId = new Map(intervals.map((i) => [`${i.owner}\0${i.name}\0${i.revision}`, i]));
  const problems: string[] = [];
  for (const w of events) {
    if (w.event !== "write") continue;
    const interval = byId.get(`${w.owner}\0${w.name}\0${w.revision}`);
    const end = interval?.end ?? diedAt[w.owner] ?? Number.POSITIVE_INFINITY;
    if (!interval) problems.push(`${w.name}: write by ${w.owner}@${w.revision} at ${w.at} without an activation`);
    else if (w.at < interval.start || w.at > end)
      problems.push(`${w.name}: write by ${w.owner}@${w.revision} at ${w.at} outside [${interval.start}, ${end}]`);
  }
  return problems;
}

// A bounded line splitter for instance output: long lines are cut, and a byte budget refilled
// over time pauses the pipe when spent, so a flood slows the instance that makes it (its writes
// block) instead of growing the host's memory or taking its CPU.
import type { Readable } from "node:stream";

export interface LineLimits {
  /** Longest line kept, in bytes; the rest of a longer line is dropped (default 8 KiB). */
  readonly maxLineBytes?: number;
  /** Bytes read per second on average (default 1 MiB/s). */
  readonly bytesPerSecond?: number;
  /** Bytes that may be read at once before the budget applies (default 4 MiB). */
  readonly burstBytes?: number;
  /**
   * What a line costs from the budget beyond its bytes (default 128): a flood of empty lines
   * is paced like one of 128-byte lines (8,192 lines a second at 1 MiB/s), not a million.
   */
  readonly lineCostBytes?: number;
}

/** What the splitter has done, for tests and logs. */
export interface LineStats {
  bytes: number;
  lines: number;
  /** Lines longer than the limit (each delivered cut). */
  cutLines: number;
  /** Times the pipe was paused for the budget. */
  pauses: number;
}

export const CUT_MARK = " …[cut]";

/** Calls `onLine` for each line of `stream`; the returned stats are updated as it reads. */
export function boundedLines(stream: Readable, onLine: (line: string) => void, limits: LineLimits = {}): LineStats {
  const maxLine = limits.maxLineBytes ?? 8 * 1024;
  const rate = limits.bytesPerSecond ?? 1024 * 1024;
  const burst = limits.burstBytes ?? 4 * 1024 * 1024;
  const lineCost = limits.lineCostBytes ?? 128;
  const stats: LineStats = { bytes: 0, lines: 0, cutLines: 0, pauses: 0 };
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let cutting = false;
  let budget = burst;
  let refilledAt = Date.now();
  let resumeTimer: NodeJS.Timeout | undefined;

  const emit = (line: Buffer, cut: boolean) => {
    stats.lines += 1;
    if (cut) stats.cutLines += 1;
    onLine(line.toString("utf8") + (cut ? CUT_MARK : ""));
  };
  const keep = (part: Buffer) => {
    if (cutting) return;
    const room = maxLine - pendingBytes;
    if (part.length > room) {
      pending.push(Buffer.from(part.subarray(0, room)));
      pendingBytes += room;
      cutting = true;
      return;
    }
    // A copy: a slice would keep the whole chunk it came from alive.
    pending.push(Buffer.from(part));
    pendingBytes += part.length;
  };
  const endLine = () => {
    emit(Buffer.concat(pending, pendingBytes), cutting);
    pending = [];
    pendingBytes = 0;
    cutting = false;
  };

  stream.on("data", (chunk: Buffer) => {
    stats.bytes += chunk.length;
    let start = 0;
    let lines = 0;
    for (let newline = chunk.indexOf(10); newline !== -1; newline = chunk.indexOf(10, start)) {
      keep(chunk.subarray(start, newline));
      endLine();
      start = newline + 1;
      lines += 1;
    }
    if (start < chunk.length) keep(chunk.subarray(start));
    const now = Date.now();
    budget = Math.min(burst, budget + ((now - refilledAt) / 1000) * rate) - chunk.length - lines * lineCost;
    refilledAt = now;
    if (budget < 0 && !resumeTimer) {
      stats.pauses += 1;
      stream.pause();
      resumeTimer = setTimeout(
        () => {
          resumeTimer = undefined;
          stream.resume();
        },
        Math.ceil((-budget / rate) * 1000),
      );
    }
  });
  stream.on("end", () => {
    if (pendingBytes > 0 || cutting) endLine();
  });
  stream.on("close", () => clearTimeout(resumeTimer));
  // A broken pipe ends the output; the exit is reported elsewhere.
  stream.on("error", () => undefined);
  return stats;
}

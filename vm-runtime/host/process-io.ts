// What the providers wait on: an instance's boot and ready lines on stdout, its readiness
// probe answering over HTTP, and its exit. Also drains and forwards its output.
import type { ChildProcess } from "node:child_process";
import { EventEmitter, once } from "node:events";
import { request } from "node:http";
import type { Readable } from "node:stream";
import { boundedLines } from "./output-lines.ts";
import { BOOTED_LINE, parseReadyLine, READY_KEY } from "../runtime/boot.ts";
import { MicrovmImageTimeout, type Upstream } from "./provider.ts";
import { within } from "./provider-util.ts";
import { isErrorLine } from "./start-failure.ts";
import { RPC_HEALTH_PATH } from "../wire/rpc.ts";

/** How every line of the runtime's start-up protocol begins (`{"~microvm/runtime":…}`). */
const RUNTIME_LINE_PREFIX = `{${JSON.stringify(READY_KEY)}:`;

/** Receives each line an instance prints. */
export type OutputSink = (microvmId: string, stream: "stdout" | "stderr", line: string) => void;

/** An instance's output: stdout lines as events, and the last stderr lines for error messages. */
export interface OutputWatch {
  readonly stdout: EventEmitter<{ line: [string] }>;
  readonly stderrTail: string[];
  /**
   * The last stderr lines that say why it failed (`isErrorLine`), kept apart from the tail: a
   * long trace after one (node's native stack after a FATAL ERROR) does not push it out.
   */
  readonly stderrErrors: string[];
  /** The runtime printed `BOOTED_LINE`: a start failing from then on is the image's doing. */
  booted: boolean;
  /** The port the runtime's ready line announced, once it did. */
  readyPort?: number;
}

const STDERR_TAIL_LINES = 20;
const STDERR_ERROR_LINES = 5;
/** How long an exited process's pipes may take to yield what it wrote before it ended. */
const DRAIN_MS = 1_000;

/** Drains both pipes for the life of the process, bounded in line length and rate (output-lines.ts). */
export function watchOutput(child: ChildProcess, microvmId: string, sink?: OutputSink): OutputWatch {
  const watch: OutputWatch = { stdout: new EventEmitter(), stderrTail: [], stderrErrors: [], booted: false };
  if (child.stdout) {
    boundedLines(child.stdout, (line) => {
      if (!watch.booted && line === BOOTED_LINE) watch.booted = true;
      else if (watch.readyPort === undefined && line.startsWith(RUNTIME_LINE_PREFIX))
        watch.readyPort = parseReadyLine(line);
      watch.stdout.emit("line", line);
      // The runtime's start-up lines (booted, loaded, ready) are for its host, not the instance's output.
      if (!line.startsWith(RUNTIME_LINE_PREFIX)) sink?.(microvmId, "stdout", line);
    });
  }
  if (child.stderr) {
    boundedLines(child.stderr, (line) => {
      watch.stderrTail.push(line);
      if (watch.stderrTail.length > STDERR_TAIL_LINES) watch.stderrTail.shift();
      if (isErrorLine(line)) watch.stderrErrors.push(line);
      if (watch.stderrErrors.length > STDERR_ERROR_LINES) watch.stderrErrors.shift();
      sink?.(microvmId, "stderr", line);
    });
  }
  return watch;
}

/** Whether the instance prints `line` on stdout within `ms` (from now on). */
export function lineSeen(watch: OutputWatch, line: string, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const onLine = (printed: string) => {
      if (printed !== line) return;
      clearTimeout(timer);
      watch.stdout.off("line", onLine);
      resolve(true);
    };
    const timer = setTimeout(() => {
      watch.stdout.off("line", onLine);
      resolve(false);
    }, ms);
    watch.stdout.on("line", onLine);
  });
}

/**
 * Resolves with the port the runtime announces. Rejects at the deadline, on abort, or when
 * the process exits first, then with the last lines of its stderr, read to their end.
 */
export function waitForReadyLine(
  child: ChildProcess,
  deadline: number,
  signal: AbortSignal | undefined,
  watch: OutputWatch,
): Promise<number> {
  return untilLine(() => watch.readyPort, watch, {
    deadline,
    signal,
    late: "timed out waiting for the ready line",
    onEnd(fail) {
      const onExit = (code: number | null, sig: NodeJS.Signals | null) => {
        void outputDrained(child, DRAIN_MS).then(() => {
          const tail = watch.stderrTail.join("\n");
          fail(new Error(`instance exited (${sig ?? `code ${code}`}) before it was ready${tail ? `:\n${tail}` : ""}`));
        });
      };
      child.once("exit", onExit);
      return () => child.off("exit", onExit);
    },
  });
}

interface LineWait {
  readonly deadline: number;
  readonly signal: AbortSignal | undefined;
  /** The failure at the deadline. */
  readonly late: string;
  /** Calls `fail` once the instance has ended; returns what stops listening. */
  readonly onEnd?: (fail: (err: Error) => void) => () => void;
}

/**
 * Resolves with `seen()` once it has a value: now, or after one of the runtime's stdout lines
 * (`watchOutput` records what a line says before it emits it). Rejects at the deadline, on
 * abort, or when `onEnd` reports the instance gone.
 */
function untilLine<T>(seen: () => T | undefined, watch: OutputWatch, wait: LineWait): Promise<T> {
  const now = seen();
  if (now !== undefined) return Promise.resolve(now);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => finish(new Error(wait.late)), Math.max(0, wait.deadline - Date.now()));
    const onLine = () => {
      const value = seen();
      if (value !== undefined) finish(undefined, value);
    };
    const onAbort = () => finish(new Error("start aborted"));
    let stopEnd: (() => void) | undefined;
    let done = false;
    function finish(error: Error | undefined, value?: T) {
      if (done) return;
      done = true;
      clearTimeout(timer);
      watch.stdout.off("line", onLine);
      stopEnd?.();
      wait.signal?.removeEventListener("abort", onAbort);
      if (error) reject(error);
      else resolve(value as T);
    }
    if (wait.signal?.aborted) return onAbort();
    watch.stdout.on("line", onLine);
    stopEnd = wait.onEnd?.((err) => finish(err));
    wait.signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** What bounds a start's readiness wait (`withinImageShare`). */
export interface ReadinessBounds {
  /** The host's deadline for the whole start (epoch ms). */
  readonly hostDeadline: number;
  /** The image's share, from the runtime's boot line (`MicrovmSpec.imageTimeoutMs`). */
  readonly imageTimeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
  /** Settles when the instance has exited: a boot line is not waited for past it. */
  readonly exited?: Promise<unknown>;
}

/**
 * Runs `probe` with the deadline and signal of a start's readiness wait: the host's, or, with
 * `imageTimeoutMs`, that long after the runtime's boot line, which is awaited within the host's
 * deadline first (the time a busy host takes to boot a runtime is not the image's). A probe
 * ended by the image's time fails with a `MicrovmImageTimeout`.
 */
export async function withinImageShare<T>(
  watch: OutputWatch,
  { hostDeadline, imageTimeoutMs, signal, exited }: ReadinessBounds,
  probe: (deadline: number, signal: AbortSignal | undefined) => Promise<T>,
): Promise<T> {
  if (imageTimeoutMs === undefined) return probe(hostDeadline, signal);
  await bootLine(watch, hostDeadline, signal, exited);
  // The image's time is this signal alone: the probe's own deadline comes a second after it.
  const late = AbortSignal.timeout(imageTimeoutMs);
  try {
    return await probe(Date.now() + imageTimeoutMs + 1_000, signal ? AbortSignal.any([signal, late]) : late);
  } catch (cause) {
    if (late.aborted && !signal?.aborted) throw new MicrovmImageTimeout(imageTimeoutMs, { cause });
    throw cause;
  }
}

/**
 * Resolves once the runtime printed its boot line; rejects at `deadline`, on abort, or once
 * `exited` settles first.
 */
export async function bootLine(
  watch: OutputWatch,
  deadline: number,
  signal: AbortSignal | undefined,
  exited?: Promise<unknown>,
): Promise<void> {
  await untilLine(() => (watch.booted ? true : undefined), watch, {
    deadline,
    signal,
    late: "the runtime did not boot in time",
    ...(exited && {
      onEnd(fail) {
        const gone = () => fail(new Error("the instance exited before its runtime booted"));
        void exited.then(gone, gone);
        return () => undefined;
      },
    }),
  });
}

/** Resolves once the process's stdout and stderr are read to their end, or after `timeoutMs`. */
export async function outputDrained(child: ChildProcess, timeoutMs: number): Promise<void> {
  const open = [child.stdout, child.stderr].filter((stream): stream is Readable => stream !== null && !stream.closed);
  await within(Promise.all(open.map((stream) => once(stream, "close").catch(() => undefined))), timeoutMs);
}

/** Polls the runtime's readiness probe until it answers 200, or rejects at the deadline or on abort. */
export async function waitForHealth(
  upstream: Upstream,
  deadline: number,
  headers: Readonly<Record<string, string>> = {},
  signal?: AbortSignal,
): Promise<void> {
  let lastError: unknown;
  while (Date.now() < deadline) {
    signal?.throwIfAborted();
    try {
      const timeoutMs = Math.max(50, Math.min(1_000, deadline - Date.now()));
      const status = await probeStatus(upstream, headers, timeoutMs, signal);
      if (status === 200) return;
      lastError = new Error(`readiness probe answered ${status}`);
    } catch (error) {
      lastError = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error("runtime did not answer its readiness probe in time", { cause: lastError });
}

/**
 * One `GET /__rpc__/` to the runtime over TCP or its unix socket; resolves with the status as
 * soon as it arrives, without reading the body (an instance's answer may never end). The
 * whole exchange has `timeoutMs`; abort or the deadline destroys the request.
 */
function probeStatus(
  upstream: Upstream,
  headers: Readonly<Record<string, string>>,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const target =
      "socketPath" in upstream ? { socketPath: upstream.socketPath } : { host: upstream.host, port: upstream.port };
    const req = request({ ...target, path: RPC_HEALTH_PATH, headers: { ...headers }, agent: false }, (res) => {
      res.on("error", () => undefined);
      resolve(res.statusCode ?? 0);
      req.destroy();
    });
    const timer = setTimeout(() => req.destroy(new Error("readiness probe timed out")), timeoutMs);
    const onAbort = () => req.destroy(new Error("readiness probe aborted"));
    signal?.addEventListener("abort", onAbort, { once: true });
    req.on("close", () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    });
    req.on("error", reject);
    req.end();
  });
}

/** Resolves when the child has exited (immediately if it already has). */
export async function waitForExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  await once(child, "exit");
}

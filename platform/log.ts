// Process logs (pino): readable lines on a terminal (pino-pretty), JSON lines otherwise or with
// `LOG_FORMAT=json`. Never log tokens, secrets or request bodies.
import { pino, type Logger } from "pino";
import { PinoPretty } from "pino-pretty";
import { trace } from "@opentelemetry/api";

export type { Logger };

const levels = ["fatal", "error", "warn", "info", "debug", "trace", "silent"];

/** `LOG_LEVEL`'s problem, if any (the logger then runs at `info`): main.ts refuses to start with it. */
export const logLevelProblem: string | undefined =
  process.env.LOG_LEVEL && !levels.includes(process.env.LOG_LEVEL)
    ? `LOG_LEVEL must be one of ${levels.join(", ")}, got "${process.env.LOG_LEVEL}"`
    : undefined;

/** `LOG_FORMAT`'s problem, if any (the logger then picks by terminal). */
export const logFormatProblem: string | undefined =
  process.env.LOG_FORMAT && !["json", "pretty"].includes(process.env.LOG_FORMAT)
    ? `LOG_FORMAT must be "json" or "pretty", got "${process.env.LOG_FORMAT}"`
    : undefined;

/** True when log lines are for a person: stdout is a terminal (or `LOG_FORMAT=pretty`), not `LOG_FORMAT=json`. */
export const prettyLogs =
  process.env.LOG_FORMAT === "pretty" || (process.env.LOG_FORMAT !== "json" && process.stdout.isTTY === true);

/**
 * The trace the current code runs in, when tracing is on (tracing.ts registers the context
 * manager; without it the API knows no active span).
 */
function activeTraceId(): string | undefined {
  const id = trace.getActiveSpan()?.spanContext().traceId;
  return id && id !== "00000000000000000000000000000000" ? id : undefined;
}

/** The process logger; `LOG_LEVEL` sets the level (default `info`, tests default `warn`). */
export const log: Logger = pino(
  {
    level: logLevelProblem ? "info" : (process.env.LOG_LEVEL ?? (process.env.NODE_TEST_CONTEXT ? "warn" : "info")),
    base: { pid: process.pid },
    // With tracing on, a line written inside a span names its trace (beside the request id).
    mixin: () => {
      const traceId = activeTraceId();
      return traceId ? { traceId } : {};
    },
  },
  prettyLogs
    ? PinoPretty({ sync: true, translateTime: "SYS:HH:MM:ss.l", ignore: "pid,hostname", singleLine: true })
    : undefined,
);

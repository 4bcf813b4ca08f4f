// Structured JSON logs (pino). Never log tokens, secrets or request bodies.
import { pino, type Logger } from "pino";

export type { Logger };

/** The process logger; `LOG_LEVEL` sets the level (default `info`, tests default `warn`). */
export const log: Logger = pino({
  level: process.env.LOG_LEVEL ?? (process.env.NODE_TEST_CONTEXT ? "warn" : "info"),
  base: { pid: process.pid },
});

// Log lines as the operations that read them answer (an instance's output, an object's): the
// latest, or those after a cursor, waiting for new ones when asked.
import { Type } from "@sinclair/typebox";
import { Count } from "./counts.ts";

/** The most lines one log read answers, its default, and its longest wait for new ones. */
export const MAX_LOG_LINES = 1000;
export const DEFAULT_LOG_LINES = 100;
export const MAX_LOG_WAIT_SECONDS = 30;

/** One line an instance wrote, as a log read answers it. */
export const LogLine = Type.Object({
  time: Type.String({ format: "date-time", description: "when the host stored the line" }),
  stream: Type.Union([Type.Literal("stdout"), Type.Literal("stderr")]),
  line: Type.String({ description: "without its newline; a line longer than 8 KiB is cut and ends in ` …[cut]`" }),
});

/** The query of a log read (an instance's, an object's): the latest lines, or those after a cursor. */
export const LogQuery = Type.Object(
  {
    limit: Type.Optional(
      Count(MAX_LOG_LINES, `most lines to answer, 1-${MAX_LOG_LINES} (default ${DEFAULT_LOG_LINES})`),
    ),
    since: Type.Optional(
      Type.String({
        pattern: "^[0-9]{1,16}$",
        description:
          "a `cursor` of an earlier answer: the lines written after it, oldest first; without it, the latest lines",
      }),
    ),
    waitSeconds: Type.Optional(
      Count(
        MAX_LOG_WAIT_SECONDS,
        `with since: when no line came after it yet, wait up to this long (1-${MAX_LOG_WAIT_SECONDS} s) for one`,
      ),
    ),
    follow: Type.Optional(
      Type.Union([Type.Literal("1"), Type.Literal("true")], {
        description:
          "over HTTP: answer NDJSON, one line object a line, and go on with each new line until the client closes",
      }),
    ),
  },
  { additionalProperties: false },
);

/** A page of log lines and the cursor after them. */
export const LogPage = Type.Object({
  items: Type.Array(LogLine),
  cursor: Type.String({ description: "pass as `since` to read the lines written after these" }),
});

/** Milliseconds a log read may wait for a line (`waitSeconds`), when it asks to. */
export const logWaitMs = (input: { waitSeconds?: number | string }): number | undefined =>
  input.waitSeconds === undefined ? undefined : Number(input.waitSeconds) * 1000;

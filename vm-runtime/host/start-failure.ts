// Why an instance did not start, in words a user may read (its `stateReason`) and lines the
// host logs: how its process ended, and the error line it printed last, with no path of the
// host's and never the instance's secret.
import { MicrovmStartFailed, type InstanceExit } from "./provider.ts";

/** Longest error line quoted (a `stateReason`, an image check's answer). */
const LINE_LIMIT = 500;

/** Replaces file paths and URLs with `<module>`: an answer never shows the host's layout. */
export function withoutPaths(text: string): string {
  return text.replace(/(file:\/\/)?\/[^\s:'"()]+/g, "<module>").slice(0, LINE_LIMIT);
}

/** Whether an output line says why an instance failed (`errorLineOf` picks among such lines). */
export function isErrorLine(text: string): boolean {
  const line = text.trim();
  return (
    line.startsWith("ImageError: ") ||
    /^(\w*Error|Uncaught|Error)\b.*:/.test(line) ||
    /^\w+Error$/.test(line) ||
    line.startsWith("FATAL ERROR: ")
  );
}

/**
 * The line of an instance's output that says why it failed: the runtime's own `ImageError:`
 * line (a refused import, quoted from the module) as it is; else the last error node printed
 * (`RangeError: …`, `Uncaught …`, `FATAL ERROR: … heap out of memory`) with paths replaced.
 */
export function errorLineOf(lines: readonly string[]): string | undefined {
  const errors = lines.filter(isErrorLine).map((line) => line.trim());
  const refused = errors.find((line) => line.startsWith("ImageError: "));
  if (refused) return refused.slice(0, LINE_LIMIT);
  const thrown = errors.at(-1);
  return thrown === undefined ? undefined : withoutPaths(thrown);
}

/** `code 1` or `SIGABRT`: how a process ended. */
export function exitText(exit: InstanceExit): string {
  return exit.signal ?? `code ${exit.code}`;
}

/** How `child` ended, or undefined while it runs. */
export function exitOf(child: {
  readonly exitCode: number | null;
  readonly signalCode: NodeJS.Signals | null;
}): InstanceExit | undefined {
  return child.exitCode === null && child.signalCode === null
    ? undefined
    : { code: child.exitCode, signal: child.signalCode };
}

export interface StartFailureFacts {
  readonly cause: unknown;
  /** How the instance's process ended by itself before it was ready (undefined: it was stopped). */
  readonly exit: InstanceExit | undefined;
  /** Its last stderr lines, read to their end, and the last of them that read as errors. */
  readonly stderr: { readonly tail: readonly string[]; readonly errors: readonly string[] };
  /** The instance's secret: never quoted, whatever the instance printed. */
  readonly secret: string;
}

/**
 * The failure of a start once the runtime was up (the image's share): `instance <id> exited
 * (code 1) before it was ready: RangeError: …`, or `… did not become ready[: <error line>]`.
 */
export function startFailed(microvmId: string, facts: StartFailureFacts): MicrovmStartFailed {
  const unsaid = (lines: readonly string[]) => lines.map((line) => line.replaceAll(facts.secret, "<secret>"));
  const tail = unsaid(facts.stderr.tail);
  const line = errorLineOf(unsaid(facts.stderr.errors));
  const what = facts.exit ? `exited (${exitText(facts.exit)}) before it was ready` : "did not become ready";
  return new MicrovmStartFailed(`instance ${microvmId} ${what}${line ? `: ${line}` : ""}`, {
    cause: facts.cause,
    exit: facts.exit,
    stderr: tail.join("\n"),
  });
}

// What `taskctl` prints: records as aligned fields, instances as a table, and every failure
// as one sentence that says what to do. Errors are told apart by `name`, so that help and
// usage errors never load the clients.
import type { Static } from "@sinclair/typebox";
import type { IdlePolicy, Microvm as MicrovmSchema } from "../schemas/index.ts";
import type { ClientError } from "./index.ts";

type Microvm = Static<typeof MicrovmSchema>;

/** `key  value` lines, keys padded to one column. */
export function fields(rows: readonly (readonly [string, unknown])[]): string {
  const width = Math.max(...rows.map(([key]) => key.length));
  return rows.map(([key, value]) => `${key.padEnd(width)}  ${String(value)}`).join("\n");
}

export function taskText(task: { id: string; title: string; completed: boolean }): string {
  return fields([
    ["id", task.id],
    ["title", task.title],
    ["completed", task.completed ? "yes" : "no"],
  ]);
}

/** A task object: its name, its tasks, and where it is active (names shown with control characters visible). */
export function taskObjectLine(o: { name: string; tasks: number; activeOn?: string; leaseAgeMs?: number }): string {
  const where = o.activeOn === undefined ? "idle" : `active on ${o.activeOn} for ${o.leaseAgeMs ?? 0} ms`;
  return `${visible(o.name)}  ${o.tasks} task${o.tasks === 1 ? "" : "s"}  ${where}`;
}

export function idlePolicyText(p: IdlePolicy): string {
  return (
    `suspends after ${p.maxIdleDurationSeconds} s idle, terminates after ${p.suspendedDurationSeconds} s ` +
    `suspended, auto-resume ${p.autoResumeEnabled ? "on" : "off"}`
  );
}

export function microvmText(vm: Microvm): string {
  return fields([
    ["id", vm.microvmId],
    ["state", vm.stateReason ? `${vm.state} (${vm.stateReason})` : vm.state],
    ["image", vm.imageDigest ? `${vm.imageIdentifier} (${vm.imageDigest})` : vm.imageIdentifier],
    ["endpoint", vm.endpoint],
    ["started", vm.startedAt],
    ["policy", idlePolicyText(vm.idlePolicy)],
  ]);
}

export function microvmTable(items: readonly Microvm[]): string {
  if (items.length === 0) return "no microVMs";
  const rows = [
    ["ID", "STATE", "IMAGE", "ENDPOINT", "STARTED"],
    ...items.map((vm) => [vm.microvmId, vm.state, vm.imageIdentifier, vm.endpoint, vm.startedAt]),
  ];
  const widths = rows[0].map((_, col) => Math.max(...rows.map((row) => row[col].length)));
  return rows
    .map((row) =>
      row
        .map((cell, col) => cell.padEnd(widths[col]))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

/** Where the command sent its request, for the messages. */
export interface Target {
  /** "the Task API" etc. */
  readonly what: string;
  /** The URL, or "NATS at <url>". */
  readonly where: string;
  readonly overNats: boolean;
  /** The env var that sets the URL (HTTP only). */
  readonly urlEnv?: string;
  /** Why the URL is the default one (no service found in DATA_DIR): the hint when it is unreachable. */
  readonly noService?: string;
}

/**
 * `text` with control characters shown, not obeyed (`\x1b` as `^[`, other C0 and C1 codes as
 * `\xNN`; tabs stay): what an instance wrote cannot move the cursor or retitle the terminal.
 */
export function visible(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is the point
  return text.replace(/[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/g, (c) =>
    c === "\u001b" ? "^[" : `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`,
  );
}

/** One line (maybe two) saying why the call failed and what to try. */
export function describeFailure(err: unknown, target: Target, context: { name?: string } = {}): string {
  if (!(err instanceof Error)) return String(err);
  if (err instanceof SyntaxError && !target.overNats)
    return `${target.where} answered something that is not JSON: is it ${target.what}?`;
  if (err.name !== "ClientError") return err.message; // MicrovmLaunchError, connection failures
  if (!isClientError(err)) return err.message;
  const body = err.error as Record<string, unknown> & { _tag: string };
  switch (body._tag) {
    case "TaskNotFound":
      return `no task with id ${body.id}${context.name === undefined ? "" : ` in task object "${context.name}"`}`;
    case "TaskObjectNotFound":
      return `no task object named "${visible(String(body.name))}" (it has no tasks and no activation)`;
    case "JobNotFound":
      return `no job with id ${body.id}`;
    case "MicrovmNotFound":
      return `no microVM with id ${body.microvmIdentifier}`;
    case "ImageNotFound":
      return `no image named "${body.imageIdentifier}"`;
    case "InvalidStateTransition":
      return `microVM ${body.microvmId} is ${body.state}: ${body.message}`;
    case "MicrovmStartTimeout":
      return (
        `microVM ${body.microvmId}: ${body.message}\n` +
        `hint: \`taskctl microvm get ${body.microvmId}\` shows its state, ` +
        `\`taskctl microvm terminate ${body.microvmId}\` stops it`
      );
    case "MicrovmLimitExceeded":
      return `the microVM host runs its limit of ${body.limit} instances; terminate one first`;
    case "HttpApiDecodeError":
      return `invalid request: ${decodeIssues(body)}`;
    case "InvalidImage": {
      // What the module's instance wrote to stderr before it died, as it wrote it, indented.
      const output = Array.isArray(body.output) ? body.output.map((line) => `  | ${visible(String(line))}`) : [];
      return [`invalid image: ${String(body.message)}`, ...(output.length ? ["its output:", ...output] : [])].join(
        "\n",
      );
    }
    case "Unauthorized":
      return (
        `${target.what} refused the call (401 Unauthorized): set TASKCTL_API_KEY to an API key it knows ` +
        "(`npx taskctl apikey create <principal>` makes one, for the file API_KEYS_FILE names)"
      );
    case "ServiceUnavailable":
      return unavailable(err, target);
    case "GatewayTimeout":
      return (
        `no answer from ${target.what} in time (504 GatewayTimeout); ` + "the outcome is unknown, check before retrying"
      );
    case "InternalServerError":
      if (err.status !== 500)
        return `${target.where} answered ${err.status} without an error body: is it ${target.what}?`;
      return `${target.what} failed (500 InternalServerError); its logs have the cause`;
    default:
      return (
        `${target.what} answered ${err.status} ` +
        `${body._tag}${typeof body.message === "string" ? `: ${body.message}` : ""}`
      );
  }
}

function isClientError(err: Error): err is ClientError {
  return (
    typeof (err as Partial<ClientError>).status === "number" && typeof (err as Partial<ClientError>).error === "object"
  );
}

function decodeIssues(body: Record<string, unknown>): string {
  const issues = Array.isArray(body.issues) ? (body.issues as { path?: unknown[]; message?: string }[]) : [];
  if (issues.length === 0) return String(body.message ?? "rejected by the schema");
  return issues.map((i) => `${(i.path ?? []).join(".") || "(input)"}: ${i.message}`).join("; ");
}

const startHint = "is the service running? Start it with `npm start` (or `npm run cluster`)";

function unavailable(err: ClientError, target: Target): string {
  const cause = err.cause as (Error & { code?: string }) | undefined;
  if (target.overNats) {
    if (/no responders/i.test(`${cause?.name} ${cause?.message}`)) {
      return `nothing answers ${target.what} on ${target.where}: ${startHint} on that NATS`;
    }
    return `${target.what} is unavailable on ${target.where}${cause ? ` (${cause.message})` : ""}`;
  }
  if (cause) {
    const inner = cause.cause as (Error & { code?: string }) | undefined;
    const code = inner?.code ?? cause.code ?? cause.name;
    const why =
      code === "ECONNREFUSED"
        ? "connection refused"
        : code === "TimeoutError"
          ? "no answer in time"
          : (inner?.message ?? cause.message);
    const point = target.urlEnv ? `, or point --url or ${target.urlEnv} at it` : "";
    return `cannot reach ${target.what} at ${target.where} (${why})\nhint: ${target.noService ?? startHint}${point}`;
  }
  return (
    `${target.what} at ${target.where} is up but no actor answered (503 ServiceUnavailable); ` +
    "retry, or check that the actor processes run"
  );
}

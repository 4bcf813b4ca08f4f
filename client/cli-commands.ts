// The commands of `taskctl`: arguments, options, the typed client call, and a friendly text
// next to the raw JSON answer. `cli.ts` parses argv and runs them. Only types come from the
// contracts here: help and usage errors answer without loading them.
import type { AllowedPort } from "../schemas/index.ts";
import type { ApiName, CommandSpec, OptionSpec, OptionValues } from "./cli-spec.ts";
import { imageCommands } from "./cli-images.ts";
import { fields, idlePolicyText, microvmTable, microvmText, taskObjectLine, taskText, visible } from "./cli-output.ts";

export type { ApiName, Apis, CommandSpec, OptionSpec, OptionValues, Outcome } from "./cli-spec.ts";

const define = <A extends ApiName>(spec: CommandSpec<A>) => spec as unknown as CommandSpec;

const nameOption: OptionSpec = {
  type: "string",
  value: "OBJECT",
  description: "the task object to use (1-256 characters); without it, the object store",
};

/** A whole number from an option, or a usage error naming it. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

function integer(options: OptionValues, key: string, fallback: number): number {
  const raw = options[key];
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (typeof raw !== "string" || !/^\d+$/.test(raw.trim()) || !Number.isSafeInteger(value)) {
    throw new UsageError(`--${key} needs a whole number, got "${String(raw)}"`);
  }
  return value;
}

function allowedPorts(options: OptionValues): AllowedPort[] {
  if (options["all-ports"]) return [{ allPorts: {} }];
  const given = (options.port as string[] | undefined) ?? ["8080"];
  return given.map((raw) => {
    const range = /^(\d+)-(\d+)$/.exec(raw.trim());
    if (range) return { range: { startPort: Number(range[1]), endPort: Number(range[2]) } };
    if (!/^\d+$/.test(raw.trim()))
      throw new UsageError(`--port needs a port number or a range START-END, got "${raw}"`);
    return { port: Number(raw) };
  });
}

/** `--limit` and `--cursor` of a list command whose items are `what`. */
const pageOptions = (what: string): Record<string, OptionSpec> => ({
  limit: { type: "string", value: "N", description: `${what} per page, 1-1000 (default 100)` },
  cursor: { type: "string", value: "CURSOR", description: "the page after the one that printed it" },
});

/** A list's page request from `--limit` and `--cursor`. */
function pageInput(options: OptionValues) {
  return {
    limit: options.limit === undefined ? undefined : integer(options, "limit", 100),
    cursor: options.cursor as string | undefined,
  };
}

/** A page as lines, then the cursor of the next one; `none` when it is empty. */
function pageText(lines: string[], cursor: string | undefined, none: string): string {
  if (cursor) lines.push(`next page: --cursor ${cursor}`);
  return lines.join("\n") || none;
}

const ifMatchOption: OptionSpec = {
  type: "string",
  value: "REVISION",
  description: "only if the task is still at this revision (update prints it), else 412",
};

/** `--completed yes|no` (also true/false) as a boolean, or a usage error. */
function completedOption(options: OptionValues): boolean | undefined {
  const raw = options.completed;
  if (raw === undefined) return undefined;
  if (typeof raw === "string" && /^(yes|true)$/i.test(raw)) return true;
  if (typeof raw === "string" && /^(no|false)$/i.test(raw)) return false;
  throw new UsageError(`--completed needs yes or no, got "${String(raw)}"`);
}

/** The typed client's call options for `--if-match`, and what reports the revision. */
function revisionOptions(options: OptionValues) {
  const ifMatch = options["if-match"] === undefined ? undefined : integer(options, "if-match", 0);
  const seen: { revision?: number } = {};
  return { call: { ifMatch, onRevision: (r: number) => (seen.revision = r) }, seen };
}

const transition = (
  name: "suspend" | "resume" | "terminate",
  op: "suspendMicrovm" | "resumeMicrovm" | "terminateMicrovm",
  summary: string,
) =>
  define({
    group: "microvm",
    name,
    args: ["ID"],
    api: "microvm",
    summary,
    async run(client, [id]) {
      const answer = await client[op]({ microvmIdentifier: id });
      return { json: answer, text: `${answer.microvmId} ${answer.state}` };
    },
  });

export const commands: readonly CommandSpec[] = [
  define({
    group: "tasks",
    name: "create",
    args: ["TITLE"],
    api: "task",
    summary: "Create a task; prints it with its new id",
    options: { name: nameOption },
    async run(client, [title], options) {
      const name = options.name as string | undefined;
      const task = name === undefined ? await client.createTask({ title }) : await client.createTaskDO({ title, name });
      return {
        json: task,
        text: `created task ${task.id}${name === undefined ? "" : ` in task object "${name}"`}\n${taskText(task)}`,
      };
    },
  }),
  define({
    group: "tasks",
    name: "get",
    args: ["ID"],
    api: "task",
    summary: "Read a task",
    options: { name: nameOption },
    async run(client, [id], options) {
      const name = options.name as string | undefined;
      const task = name === undefined ? await client.getTask({ id }) : await client.getTaskDO({ id, name });
      return { json: task, text: taskText(task) };
    },
  }),
  define({
    group: "tasks",
    name: "update",
    args: ["ID"],
    api: "task",
    summary: "Change a task's title and/or completed; prints it with its new revision",
    options: {
      name: nameOption,
      title: { type: "string", value: "TITLE", description: "the new title" },
      completed: { type: "string", value: "yes|no", description: "whether it is done" },
      "if-match": ifMatchOption,
    },
    async run(client, [id], options) {
      const name = options.name as string | undefined;
      const change = { title: options.title as string | undefined, completed: completedOption(options) };
      const { call, seen } = revisionOptions(options);
      const task =
        name === undefined
          ? await client.updateTask({ id, ...change }, call)
          : await client.updateTaskDO({ id, name, ...change }, call);
      return { json: task, text: `${taskText(task)}\n${fields([["revision", String(seen.revision ?? "")]])}` };
    },
  }),
  define({
    group: "tasks",
    name: "rm",
    args: ["ID"],
    api: "task",
    summary: "Delete a task",
    options: { name: nameOption, "if-match": ifMatchOption },
    async run(client, [id], options) {
      const name = options.name as string | undefined;
      const { call } = revisionOptions(options);
      if (name === undefined) await client.deleteTask({ id }, call);
      else await client.deleteTaskDO({ id, name }, call);
      return { json: null, text: `deleted task ${id}` };
    },
  }),
  define({
    group: "tasks",
    name: "ls",
    args: [],
    api: "task",
    summary: "List tasks, a page at a time (in key order); prints the cursor of the next page",
    options: { name: nameOption, ...pageOptions("tasks") },
    async run(client, _args, options) {
      const name = options.name as string | undefined;
      const page = pageInput(options);
      const answer = name === undefined ? await client.listTasks(page) : await client.listTasksDO({ ...page, name });
      const lines = answer.items.map((t) => `${t.id}  ${t.completed ? "[x]" : "[ ]"} ${t.title}`);
      return { json: answer, text: pageText(lines, answer.cursor, "no tasks") };
    },
  }),
  define({
    group: "objects",
    name: "ls",
    args: [],
    api: "task",
    summary: "List the task objects that store tasks or are active (by name token); prints the cursor of the next page",
    options: pageOptions("objects"),
    async run(client, _args, options) {
      const answer = await client.listTaskObjects(pageInput(options));
      return { json: answer, text: pageText(answer.items.map(taskObjectLine), answer.cursor, "no task objects") };
    },
  }),
  define({
    group: "objects",
    name: "get",
    args: ["NAME"],
    api: "task",
    summary: "Describe a task object: how many tasks it stores, and which process holds its activation",
    async run(client, [name]) {
      // An empty name would be the list's path (`/do/objects/`): refuse it here.
      if (!name) throw new UsageError("objects get needs a NAME of 1-256 characters");
      const info = await client.getTaskObject({ name });
      return {
        json: info,
        text: fields([
          ["name", visible(info.name)],
          ["tasks", info.tasks],
          ["active on", info.activeOn ?? "none (idle)"],
          ...(info.leaseAgeMs === undefined ? [] : [["active for", `${info.leaseAgeMs} ms`] as const]),
        ]),
      };
    },
  }),
  define({
    group: "jobs",
    name: "create",
    args: ["CONTENT"],
    api: "job",
    summary: "Create a job; prints its new id",
    async run(client, [content]) {
      const id = await client.createJob({ content });
      return { json: id, text: `created job ${id}` };
    },
  }),
  define({
    group: "jobs",
    name: "get",
    args: ["ID"],
    api: "job",
    summary: "Read a job",
    async run(client, [jobId]) {
      const job = await client.getJob({ jobId });
      return {
        json: job,
        text: fields([
          ["id", job.id],
          ["content", job.content],
        ]),
      };
    },
  }),
  define({
    group: "microvm",
    name: "run",
    args: [],
    api: "microvm",
    summary: "Launch an instance of an image; prints its id and endpoint",
    options: {
      image: { type: "string", value: "IMAGE", description: 'the image (default "sandbox")' },
      idle: { type: "string", value: "SECONDS", description: "suspend after this long without requests (default 300)" },
      suspended: { type: "string", value: "SECONDS", description: "terminate after this long suspended (default 600)" },
      "no-auto-resume": { type: "boolean", description: "do not resume a suspended instance on a request" },
      wait: {
        type: "boolean",
        description: "answer once the instance is RUNNING (the service waits: RunMicrovm ?wait=running)",
      },
      "wait-seconds": {
        type: "string",
        value: "SECONDS",
        description: "wait at most this long, 1-60 (default 30), then fail naming the instance; implies --wait",
      },
    },
    async run(client, _args, options) {
      const { DEFAULT_IDLE_POLICY, DEFAULT_RUN_WAIT_SECONDS } = await import("./cli-apis.ts");
      const idlePolicy = {
        maxIdleDurationSeconds: integer(options, "idle", DEFAULT_IDLE_POLICY.maxIdleDurationSeconds),
        suspendedDurationSeconds: integer(options, "suspended", DEFAULT_IDLE_POLICY.suspendedDurationSeconds),
        autoResumeEnabled: !options["no-auto-resume"],
      };
      const imageIdentifier = (options.image as string | undefined) ?? "sandbox";
      const wait = options.wait === true || options["wait-seconds"] !== undefined;
      const waitSeconds = integer(options, "wait-seconds", DEFAULT_RUN_WAIT_SECONDS);
      const answer = await client.runMicrovm(
        { imageIdentifier, idlePolicy, ...(wait ? { wait: "running" as const, waitSeconds } : {}) },
        { idempotencyKey: crypto.randomUUID() },
      );
      if (!wait) {
        return {
          json: answer,
          text:
            `launched microVM ${answer.microvmId} (${answer.state}) at ${answer.endpoint}\n` +
            idlePolicyText(idlePolicy),
        };
      }
      // RUNNING already (the service answered after its wait): one read for the whole record.
      const vm = await client.getMicrovm({ microvmIdentifier: answer.microvmId });
      return { json: vm, text: `launched microVM ${vm.microvmId}\n${microvmText(vm)}` };
    },
  }),
  define({
    group: "microvm",
    name: "ls",
    args: [],
    api: "microvm",
    summary: "List instances, oldest first",
    async run(client) {
      const answer = await client.listMicrovms({});
      return { json: answer, text: microvmTable(answer.items) };
    },
  }),
  define({
    group: "microvm",
    name: "get",
    args: ["ID"],
    api: "microvm",
    summary: "Describe an instance",
    async run(client, [id]) {
      const vm = await client.getMicrovm({ microvmIdentifier: id });
      return { json: vm, text: microvmText(vm) };
    },
  }),
  define({
    group: "microvm",
    name: "token",
    args: ["ID"],
    api: "microvm",
    summary: "Mint a token for the instance proxy; prints the header to send",
    options: {
      minutes: { type: "string", value: "MINUTES", description: "lifetime, 1-60 (default 5)" },
      port: {
        type: "string",
        value: "PORT",
        multiple: true,
        description: "a port or a range START-END the token opens; repeatable (default 8080)",
      },
      "all-ports": { type: "boolean", description: "open every port" },
    },
    async run(client, [id], options) {
      const answer = await client.createAuthToken({
        microvmIdentifier: id,
        expirationInMinutes: integer(options, "minutes", 5),
        allowedPorts: allowedPorts(options),
      });
      return { json: answer, text: `X-aws-proxy-auth: ${answer.authToken["X-aws-proxy-auth"]}` };
    },
  }),
  define({
    group: "microvm",
    name: "logs",
    args: ["ID"],
    api: "microvm",
    summary: "Print what an instance wrote (stdout and stderr), oldest first; -f follows new lines",
    options: {
      follow: { type: "boolean", short: "f", description: "go on printing each new line until Ctrl-C" },
      limit: { type: "string", value: "N", description: "the latest N lines first, 1-1000 (default 100)" },
    },
    async run(client, [id], options, out) {
      const first = await client.getMicrovmLogs({ microvmIdentifier: id, limit: integer(options, "limit", 100) });
      const print = (lines: typeof first.items) => {
        for (const line of lines) out(options.json ? JSON.stringify(line) : visible(line.line));
      };
      if (!options.follow) return { json: first, text: first.items.map((l) => visible(l.line)).join("\n") };
      print(first.items);
      // A long poll at a time: each answer starts after the last line printed.
      for (let cursor = first.cursor; ; ) {
        const page = await client.getMicrovmLogs({ microvmIdentifier: id, since: cursor, waitSeconds: 20 });
        print(page.items);
        cursor = page.cursor;
      }
    },
  }),
  transition("suspend", "suspendMicrovm", "Suspend a RUNNING instance"),
  transition("resume", "resumeMicrovm", "Resume a SUSPENDED instance"),
  transition("terminate", "terminateMicrovm", "Terminate an instance"),
  ...imageCommands,
];

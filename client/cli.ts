// `taskctl`: the Task, Job and microVM APIs from a shell, over HTTP (the gateways) or straight
// over NATS (`--nats`). Exit status: 0 done, 1 the call failed, 2 bad usage.
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  commands,
  UsageError,
  type ApiName,
  type CommandSpec,
  type OptionSpec,
  type OptionValues,
} from "./cli-commands.ts";
import { describeFailure, type Target } from "./cli-output.ts";
import { dataDirOf, localNatsUrl, localService, noNatsHint, noServiceHint } from "./local-service.ts";

export interface CliIo {
  out(text: string): void;
  err(text: string): void;
  readonly env: NodeJS.ProcessEnv;
}

const commonOptions: Record<string, OptionSpec & { short?: string }> = {
  json: { type: "boolean", description: "print the raw JSON answer instead of text" },
  url: { type: "string", value: "URL", description: "the API's base URL (see below for the defaults)" },
  nats: {
    type: "string",
    value: "URL",
    description:
      'call the actors straight over NATS (comma-separated URLs for a cluster; "" for the NATS of the npm start on DATA_DIR)',
  },
  help: { type: "boolean", short: "h", description: "show this help" },
};

const endpoints: Record<ApiName, { what: string; env: string; url: string }> = {
  task: { what: "the Task API", env: "TASK_API_URL", url: "http://127.0.0.1:8787" },
  job: { what: "the Job API", env: "JOB_API_URL", url: "http://127.0.0.1:8788" },
  microvm: { what: "the microVM API", env: "MICROVM_API_URL", url: "http://127.0.0.1:8789" },
};

const groups = [...new Set(commands.map((c) => c.group))];

function usageLine(c: CommandSpec): string {
  const opts = Object.entries(c.options ?? {}).map(
    ([key, o]) => `[--${key}${o.value ? ` ${o.value}` : ""}]${o.multiple ? "..." : ""}`,
  );
  return ["taskctl", c.group, c.name, ...c.args, ...opts].join(" ");
}

function optionLines(options: Record<string, OptionSpec & { short?: string }>): string[] {
  const rows = Object.entries(options).map(([key, o]) => [
    `${o.short ? `-${o.short}, ` : ""}--${key}${o.value ? ` ${o.value}` : ""}`,
    o.description,
  ]);
  const width = Math.max(...rows.map(([left]) => left.length));
  return rows.map(([left, right]) => `  ${left.padEnd(width)}  ${right}`);
}

const commonHelp = () => [
  "options of every command:",
  ...optionLines(commonOptions),
  "",
  "URLs: --url, else TASK_API_URL / JOB_API_URL / MICROVM_API_URL, else http://127.0.0.1:8787 / :8788 / :8789",
  "(what `npm start` listens on). With --nats the subject prefix is NATS_SUBJECT_PREFIX (none by default).",
  "API keys: TASKCTL_API_KEY is sent as the bearer key. NATS credentials: NATS_CREDS, NATS_USER/NATS_PASSWORD,",
  "NATS_NKEY (a seed file), NATS_AUTH_DIR, else for the NATS of a local `npm start` its `internal` user.",
  "TASKCTL_TIMEOUT_MS: how long to wait for an answer over HTTP (default 15000), plus a run's --wait and a suspend's or resume's wait for its snapshot.",
];

function generalHelp(): string {
  const width = Math.max(...commands.map((c) => `${c.group} ${c.name}`.length));
  return [
    "taskctl: the Task, Job and microVM APIs from the command line",
    "",
    "usage: taskctl <group> <command> [arguments] [options]",
    "",
    ...commands.map((c) => `  ${`${c.group} ${c.name}`.padEnd(width)}  ${c.summary}`),
    `  ${"apikey create".padEnd(width)}  Make an API key for a principal: prints the key and its API_KEYS_FILE line`,
    "",
    ...commonHelp(),
    "",
    "help on a command: taskctl tasks create --help; taskctl --version. Exit status: 0 done, 1 the call failed, 2 bad usage.",
  ].join("\n");
}

function groupHelp(group: string): string {
  return [
    `usage:`,
    ...commands.filter((c) => c.group === group).map((c) => `  ${usageLine(c)}`),
    "",
    `help on a command: taskctl ${group} <command> --help`,
  ].join("\n");
}

function commandHelp(c: CommandSpec): string {
  return [
    `usage: ${usageLine(c)} [--json] [--url URL | --nats URL]`,
    "",
    `${c.summary}.`,
    ...(c.options ? ["", "options:", ...optionLines(c.options)] : []),
    "",
    ...commonHelp(),
  ].join("\n");
}

/** Runs one command line; resolves to the exit status. */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  try {
    return await dispatch(argv, io);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    io.err(`error: ${err.message}`);
    return 2;
  }
}

async function dispatch(argv: readonly string[], io: CliIo): Promise<number> {
  const allOptions = Object.assign({}, commonOptions, ...commands.map((c) => c.options ?? {}));
  const loose = parseArgs({ args: [...argv], options: allOptions, strict: false, allowPositionals: true });
  const [group, name] = loose.positionals;
  const help = loose.values.help === true;
  if (group === undefined && loose.values.version === true) {
    io.out((await import("./cli-platform.ts")).packageVersion());
    return 0;
  }
  if (group === undefined || group === "help") {
    if (!help && group !== "help") throw new UsageError(`missing command\n\n${generalHelp()}`);
    io.out(generalHelp());
    return 0;
  }
  if (group === "apikey") return apiKeyCommand(loose.positionals.slice(1), help, io);
  if (!groups.includes(group as never))
    throw new UsageError(`unknown command "${group}"; the groups are ${groups.join(", ")} (taskctl --help)`);
  if (name === undefined) {
    if (!help) throw new UsageError(`missing command after "${group}"\n${groupHelp(group)}`);
    io.out(groupHelp(group));
    return 0;
  }
  const command = commands.find((c) => c.group === group && c.name === name);
  if (!command) throw new UsageError(`unknown command "${group} ${name}"\n${groupHelp(group)}`);
  const { values, positionals } = strictParse(command, argv);
  if (values.help) {
    io.out(commandHelp(command));
    return 0;
  }
  const args = positionals.slice(2);
  if (args.length < command.args.length) {
    throw new UsageError(
      `${group} ${name} needs ${command.args.slice(args.length).join(" and ")}\nusage: ${usageLine(command)}`,
    );
  }
  if (args.length > command.args.length)
    throw new UsageError(`unexpected argument "${args[command.args.length]}" (quote a value with spaces)`);
  if (values.url !== undefined && values.nats !== undefined) throw new UsageError("use --url or --nats, not both");
  return execute(command, args, values, io);
}

function strictParse(command: CommandSpec, argv: readonly string[]): { values: OptionValues; positionals: string[] } {
  try {
    return parseArgs({
      args: [...argv],
      options: { ...commonOptions, ...command.options },
      strict: true,
      allowPositionals: true,
    });
  } catch (err) {
    const { code, message } = err as { code?: string; message: string };
    const option = /'(-[^' ]+)/.exec(message)?.[1];
    const see = `(taskctl ${command.group} ${command.name} --help)`;
    if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION")
      throw new UsageError(`unknown option ${option} for "${command.group} ${command.name}" ${see}`);
    if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") throw new UsageError(`${option} needs a value ${see}`);
    throw new UsageError(`${message} ${see}`);
  }
}

async function execute(command: CommandSpec, args: string[], values: OptionValues, io: CliIo): Promise<number> {
  const endpoint = endpoints[command.api];
  const natsUrl = values.nats as string | undefined;
  const given = (values.url as string | undefined) ?? io.env[endpoint.env];
  // Neither flag nor variable: the APIs of the service on DATA_DIR, else the defaults.
  const local = natsUrl === undefined && given === undefined ? await localService(io.env) : undefined;
  const url = given ?? local?.apis?.[command.api] ?? endpoint.url;
  const target: Target =
    natsUrl !== undefined
      ? { what: endpoint.what, where: `NATS at ${natsUrl || `DATA_DIR=${dataDirOf(io.env)}`}`, overNats: true }
      : {
          what: endpoint.what,
          where: url,
          overNats: false,
          urlEnv: endpoint.env,
          ...(local && !local.apis ? { noService: noServiceHint(local) } : {}),
        };
  let nc: NatsConnection | undefined;
  try {
    if (natsUrl === undefined) checkedUrl(url);
    // Loaded only now, not for help and usage errors; NATS only with --nats. The service checks
    // every input with the contracts' schemas (the same 400), so the CLI does not load them.
    const { httpClient, nodeHttpSend, taskApi, jobApi, microvmApi } = await import("./cli-apis.ts");
    const api = { task: taskApi, job: jobApi, microvm: microvmApi }[command.api];
    if (natsUrl !== undefined) nc = await connectOrExplain(natsUrl, io.env);
    const client = nc
      ? (await import("./nats-client.ts")).natsClient(api, nc, {
          prefix: io.env.NATS_SUBJECT_PREFIX ?? "",
          validate: false,
        })
      : httpClient(api, url, {
          fetch: nodeHttpSend,
          // A run that waits for RUNNING gets its wait on top of this (RunMicrovm's waitSeconds).
          timeoutMs: Number(io.env.TASKCTL_TIMEOUT_MS) || 15_000,
          apiKey: io.env.TASKCTL_API_KEY || undefined,
          validate: false,
        });
    const outcome = await command.run(client as never, args, values, (text) => io.out(text));
    io.out(values.json ? JSON.stringify(outcome.json) : outcome.text);
    return 0;
  } catch (err) {
    if (err instanceof UsageError) throw err;
    io.err(`error: ${describeFailure(err, target, { name: values.name as string | undefined })}`);
    return 1;
  } finally {
    await nc?.close();
  }
}

function checkedUrl(url: string): string {
  if (!/^https?:\/\/[^/]/.test(url)) throw new UsageError(`--url needs an http:// or https:// URL, got "${url}"`);
  return url;
}

/**
 * Joins `asked` (`--nats URL`; empty: the NATS of the `npm start` on DATA_DIR) with the client
 * credentials; a failure is one message naming what to check.
 */
async function connectOrExplain(asked: string, env: NodeJS.ProcessEnv): Promise<NatsConnection> {
  const servers = asked || (await localNatsUrl(env));
  if (!servers) throw new Error(`${noNatsHint(env)}, or give --nats a URL`);
  const { authOptions, findClientCredentials, connect } = await import("./cli-platform.ts");
  const { credentials, source } = await findClientCredentials(servers, env);
  try {
    return await connect({
      servers: servers.split(",").map((s) => s.trim()),
      name: "taskctl",
      timeout: 5_000,
      maxReconnectAttempts: 0,
      ...authOptions(credentials),
    });
  } catch (err) {
    const why = (err as Error).message;
    if ((err as Error).name === "AuthorizationError")
      throw new Error(
        `the NATS at ${servers} refused taskctl's credentials (${why}); credentials used: ${source}\nhint: for the NATS ` +
          "of an `npm start`, set DATA_DIR to that service's data directory (its nats-url and nats-auth/ are read); " +
          "for another NATS, set NATS_CREDS, NATS_USER/NATS_PASSWORD or NATS_NKEY",
        { cause: err },
      );
    throw new Error(
      `cannot connect to NATS at ${servers} (${why})\nhint: is the service's NATS running? \`npm start\` writes its ` +
        `private server's URL to DATA_DIR/nats-url (DATA_DIR=${dataDirOf(env)}), \`npm run cluster\` to .data/cluster/nats-url`,
      { cause: err },
    );
  }
}

/** `taskctl apikey create <principal>`: a new key, shown once, and the line that grants it. */
async function apiKeyCommand(args: readonly string[], help: boolean, io: CliIo): Promise<number> {
  const usage = "usage: taskctl apikey create <principal>";
  if (help) {
    io.out(
      `${usage}\n\nPrints a new API key for <principal> (shown once; only its hash is stored) and the line\nto add to the file API_KEYS_FILE names. Callers send it as \`Authorization: Bearer <key>\`.`,
    );
    return 0;
  }
  if (args[0] !== "create" || args.length !== 2) throw new UsageError(usage);
  const { newApiKey } = await import("./cli-platform.ts");
  let made;
  try {
    made = newApiKey(args[1]!);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  io.out(
    `key:  ${made.key}\nline: ${made.line}\n(add the line to the file API_KEYS_FILE names; the key is shown only now)`,
  );
  return 0;
}

const defaultIo: CliIo = {
  out: (text) => void process.stdout.write(`${text}\n`),
  err: (text) => void process.stderr.write(`${text}\n`),
  env: process.env,
};

/** The process entry, for `tsx client/cli.ts` and `client/cli-bin.mjs`. */
export async function main(argv = process.argv.slice(2)): Promise<void> {
  process.exitCode = await runCli(argv, defaultIo).catch((err: unknown) => {
    defaultIo.err(`error: ${(err as Error).stack ?? String(err)}`);
    return 1;
  });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();

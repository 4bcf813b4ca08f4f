// A NATS connection for another service or tool: NATS_URL, else the private server of a local
// `npm start` (DATA_DIR/nats-url), with NATS_CREDS / NATS_USER / NATS_NKEY, else that server's
// generated `internal` user. Pass it to `natsClient` or `watchJobs`.
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { authOptions, findClientCredentials } from "../platform/index.ts";
import { dataDirOf, localNatsUrl, noNatsHint } from "./local-service.ts";

export interface ServiceConnectOptions {
  /** NATS URL(s), comma-separated; default NATS_URL, else the local `npm start`'s. */
  servers?: string;
  /** Connection name shown by the server. */
  name?: string;
  env?: NodeJS.ProcessEnv;
}

/** Which NATS `connectToService` joins, and where that came from (to say so). */
export async function serviceNats(options: ServiceConnectOptions = {}): Promise<{ servers: string; from: string }> {
  const env = options.env ?? process.env;
  if (options.servers) return { servers: options.servers, from: "given" };
  if (env.NATS_URL) return { servers: env.NATS_URL, from: "NATS_URL" };
  const servers = await localNatsUrl(env);
  if (!servers) throw new Error(`no NATS to join: ${noNatsHint(env)}, or set NATS_URL`);
  return { servers, from: `DATA_DIR=${dataDirOf(env)}, written by npm start` };
}

/**
 * A connection to the service's NATS. A failure is an Error whose message is one line (what
 * was tried, what to check), for a script to print as it is.
 */
export async function connectToService(options: ServiceConnectOptions = {}): Promise<NatsConnection> {
  const env = options.env ?? process.env;
  const { servers, from } = await serviceNats(options);
  const { credentials, source } = await findClientCredentials(servers, env);
  try {
    return await connect({
      servers: servers.split(",").map((s) => s.trim()),
      name: options.name ?? "client",
      ...authOptions(credentials),
    });
  } catch (err) {
    const refused = (err as Error).name === "AuthorizationError";
    const hint = refused
      ? `credentials used: ${source}; for the NATS of an npm start set DATA_DIR to its data directory, ` +
        "else NATS_CREDS, NATS_USER/NATS_PASSWORD or NATS_NKEY"
      : from === "NATS_URL"
        ? "is NATS_URL right?"
        : from === "given"
          ? "is the URL right?"
          : "is that `npm start` still running? (or set NATS_URL)";
    const what = refused ? "the NATS at" : "cannot reach NATS at";
    throw new Error(
      `${what} ${servers} (${from})${refused ? " refused the credentials" : ""}: ${(err as Error).message}; ${hint}`,
      { cause: err },
    );
  }
}

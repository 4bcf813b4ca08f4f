// A NATS connection for another service or tool: NATS_URL, else the private server of a local
// `npm start` (DATA_DIR/nats-url), with NATS_CREDS / NATS_USER / NATS_NKEY, else that server's
// generated `internal` user. Pass it to `natsClient` or `watchJobs`.
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { authOptions, clientCredentials } from "../platform/index.ts";

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
  const file = join(env.DATA_DIR || ".data", "nats-url");
  const servers = (await readFile(file, "utf8").catch(() => "")).trim();
  if (!servers) throw new Error("no NATS to join: set NATS_URL, or start the service with `npm start` first");
  return { servers, from: `${file}, written by npm start` };
}

export async function connectToService(options: ServiceConnectOptions = {}): Promise<NatsConnection> {
  const env = options.env ?? process.env;
  const { servers, from } = await serviceNats(options);
  try {
    return await connect({
      servers: servers.split(",").map((s) => s.trim()),
      name: options.name ?? "client",
      ...authOptions(await clientCredentials(servers, env)),
    });
  } catch (err) {
    const hint =
      from === "NATS_URL"
        ? "is NATS_URL right?"
        : from === "given"
          ? "is the URL right?"
          : "is that `npm start` still running? (or set NATS_URL)";
    throw new Error(`cannot reach NATS at ${servers} (${from}): ${(err as Error).message}; ${hint}`, { cause: err });
  }
}

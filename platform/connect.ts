// NATS connections for gateways and actors: tuned options, a live view of connectivity, and
// the server's version checked on every (re)connect: a nats-server older than 2.12 is refused.
import {
  connect,
  credsAuthenticator,
  nkeyAuthenticator,
  type ConnectionOptions,
  type NatsConnection,
} from "@nats-io/transport-node";
import { poolNatsEncoding } from "./nats-encoding.ts";
import { BatchPublisher } from "./batch.ts";
import { log } from "./log.ts";
import type { NatsCredentials } from "./nats-auth.ts";
import { natsConnected, natsReconnects } from "./metrics.ts";
import { MIN_NATS_SERVER, parseNatsServerVersion, recentEnough } from "./nats-binary.ts";
import { DisconnectedError, Requester } from "./requester.ts";

export interface ConnectOptions {
  /** One URL or a comma-separated list (a cluster). */
  servers: string;
  /** Connection name shown by the server (monitoring). */
  name: string;
  /** How to authenticate (none: anonymous). */
  credentials?: NatsCredentials;
  /**
   * Called when a reconnect reaches a nats-server older than `MIN_NATS_SERVER` (a cluster node
   * not yet upgraded): the connection is closed then, and stays closed.
   */
  onServerTooOld?: (err: NatsServerTooOld) => void;
}

/** The nats-server joined is older than the service supports; the message names both versions. */
export class NatsServerTooOld extends Error {
  override name = "NatsServerTooOld";
  constructor(
    readonly server: string,
    readonly version: string,
  ) {
    super(
      `the NATS at ${server} is nats-server ${version || "of an unknown version"}, and the service needs ` +
        `${MIN_NATS_SERVER.join(".")}.0 or later (atomic batches, batch direct gets): upgrade that server`,
    );
  }
}

/** A `NatsServerTooOld` when the server `nc` is connected to now is older than the minimum. */
export function serverTooOld(nc: NatsConnection): NatsServerTooOld | undefined {
  const version = nc.info?.version ?? "";
  return recentEnough(parseNatsServerVersion(version)) ? undefined : new NatsServerTooOld(nc.getServer(), version);
}

/** A connection plus whether it is connected right now (requests while not are dropped). */
export interface NatsHandle {
  readonly nc: NatsConnection;
  /** Request/reply without per-request Error objects; fails fast when the connection drops. */
  readonly requester: Requester;
  /** Publishes gathered per event-loop turn (one socket write for many). */
  readonly publisher: BatchPublisher;
  connected(): boolean;
  close(): Promise<void>;
}

export async function connectNats(options: ConnectOptions): Promise<NatsHandle> {
  poolNatsEncoding();
  const nc = await connect({
    servers: options.servers
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean),
    name: options.name,
    ...authOptions(options.credentials),
    // An Error with a stack per request costs about a quarter of the CPU on hot paths.
    noAsyncTraces: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    reconnectJitter: 100,
    pingInterval: 10_000,
    maxPingOut: 3,
  });
  const tooOld = serverTooOld(nc);
  if (tooOld) {
    await nc.close();
    throw tooOld;
  }
  let connected = true;
  const publisher = new BatchPublisher(nc);
  const requester = new Requester(nc, publisher);
  natsConnected.set(1);
  const lost = (reason: "disconnect" | "close") => {
    requester.failAll(new DisconnectedError("NATS connection lost"));
    if (!connected) return void (reason === "close" && connectionBack());
    connected = false;
    natsConnected.set(0);
    // An own close (shutdown) is not a loss worth a warning.
    if (reason === "disconnect") connectionLost(options.servers);
  };
  void (async () => {
    for await (const status of nc.status()) {
      // A permission violation is the server refusing one publish or subscribe: say which.
      if (status.type === "error")
        log.warn({ name: options.name, err: status.error.message }, "NATS refused an operation");
      else if (status.type === "disconnect" || status.type === "reconnecting") lost("disconnect");
      else if (status.type === "close") lost("close");
      else if (status.type === "reconnect" && serverTooOld(nc)) {
        const err = serverTooOld(nc)!;
        log.error({ name: options.name, nats: err.server, version: err.version }, err.message);
        options.onServerTooOld?.(err);
        await nc.close();
      } else if (status.type === "reconnect" && !connected) {
        connected = true;
        natsConnected.set(1);
        natsReconnects.inc();
        connectionBack(nc.getServer());
      }
    }
  })();
  return {
    nc,
    requester,
    publisher,
    connected: () => connected && !nc.isClosed(),
    async close() {
      if (nc.isClosed()) return;
      requester.close();
      await nc.drain().catch(() => nc.close());
    },
  };
}

/**
 * Connections of this process that are down. A process has one per role: the first one lost
 * and the last one back are logged, so an outage is one warning and one recovery line.
 */
let connectionsDown = 0;

function connectionLost(servers: string): void {
  if (connectionsDown++ === 0)
    log.warn({ nats: servers }, "lost the NATS connection: requests answer 503 until it is back; reconnecting");
}

/** A lost connection is back (`server` set) or was closed for good (no line then). */
function connectionBack(server?: string): void {
  if (connectionsDown === 0) return;
  if (--connectionsDown === 0 && server) log.info({ nats: server }, "NATS connection back");
}

/** The nats.js options of `credentials`: an authenticator, user and password, the inbox prefix. */
export function authOptions(credentials: NatsCredentials | undefined): Partial<ConnectionOptions> {
  if (!credentials) return {};
  const encode = (text: string) => new TextEncoder().encode(text);
  return {
    ...(credentials.nkeySeed ? { authenticator: nkeyAuthenticator(encode(credentials.nkeySeed)) } : {}),
    ...(credentials.creds ? { authenticator: credsAuthenticator(encode(credentials.creds)) } : {}),
    ...(credentials.user === undefined ? {} : { user: credentials.user, pass: credentials.pass ?? "" }),
    ...(credentials.inboxPrefix ? { inboxPrefix: credentials.inboxPrefix } : {}),
  };
}

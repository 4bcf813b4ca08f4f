// NATS connections for gateways and actors: tuned options and a live view of connectivity.
import { connect, type NatsConnection } from "@nats-io/transport-node";

export interface ConnectOptions {
  /** One URL or a comma-separated list (a cluster). */
  servers: string;
  /** Connection name shown by the server (monitoring). */
  name: string;
}

/** A connection plus whether it is connected right now (requests while not are dropped). */
export interface NatsHandle {
  readonly nc: NatsConnection;
  connected(): boolean;
  /** Aborted when the current connection drops: requests in flight then have no answer coming. */
  disconnectSignal(): AbortSignal;
  close(): Promise<void>;
}

export async function connectNats(options: ConnectOptions): Promise<NatsHandle> {
  const nc = await connect({
    servers: options.servers.split(",").map((s) => s.trim()).filter(Boolean),
    name: options.name,
    // An Error with a stack per request costs about a quarter of the CPU on hot paths.
    noAsyncTraces: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    reconnectJitter: 100,
    pingInterval: 10_000,
    maxPingOut: 3,
  });
  let connected = true;
  let epoch = new AbortController();
  const lost = () => {
    connected = false;
    epoch.abort();
  };
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === "disconnect" || status.type === "reconnecting" || status.type === "close") lost();
      else if (status.type === "reconnect") {
        connected = true;
        epoch = new AbortController();
      }
    }
  })();
  return {
    nc,
    connected: () => connected && !nc.isClosed(),
    disconnectSignal: () => epoch.signal,
    async close() {
      if (nc.isClosed()) return;
      await nc.drain().catch(() => nc.close());
    },
  };
}

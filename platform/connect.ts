// NATS connections for gateways and actors: tuned options and a live view of connectivity.
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { BatchPublisher } from "./batch.ts";
import { natsConnected, natsReconnects } from "./metrics.ts";
import { DisconnectedError, Requester } from "./requester.ts";

export interface ConnectOptions {
  /** One URL or a comma-separated list (a cluster). */
  servers: string;
  /** Connection name shown by the server (monitoring). */
  name: string;
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
  const publisher = new BatchPublisher(nc);
  const requester = new Requester(nc, publisher);
  natsConnected.set(1);
  const lost = () => {
    connected = false;
    natsConnected.set(0);
    requester.failAll(new DisconnectedError("NATS connection lost"));
  };
  void (async () => {
    for await (const status of nc.status()) {
      if (status.type === "disconnect" || status.type === "reconnecting" || status.type === "close") lost();
      else if (status.type === "reconnect") {
        connected = true;
        natsConnected.set(1);
        natsReconnects.inc();
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

// A NATS container with JetStream for the tests (testcontainers, @testcontainers/nats). Loaded
// by `nats.ts` only where no NATS_URL or local nats-server exists and a Docker engine answers,
// or TEST_NATS=testcontainers. Each test file's container is stopped and removed by its
// `defer`; `npm run test:containers` runs with ryuk off (TESTCONTAINERS_RYUK_DISABLED=true)
// and removes whatever a crashed run left (label org.testcontainers=true) at its end.
import { NatsContainer } from "@testcontainers/nats";

/** The image; override with TEST_NATS_IMAGE. */
export const NATS_IMAGE = process.env.TEST_NATS_IMAGE || "nats:2.15-alpine";

// The same limits as the private nats-server of `platform/server.ts`: 1 MiB bodies must fit.
const CONFIG = ["listen: 0.0.0.0:4222", "max_payload: 8388608", 'jetstream { store_dir: "/tmp/nats" }'].join("\n");
const CONFIG_PATH = "/etc/nats/test.conf";

/**
 * NatsContainer always adds `--user test --pass test`; the services and tests connect with a
 * bare URL (nats.js takes no credentials from a URL), so the container runs without them.
 */
class OpenNatsContainer extends NatsContainer {
  override withCommand(command: string[]): this {
    const open: string[] = [];
    for (let i = 0; i < command.length; i++) {
      if (command[i] === "--user" || command[i] === "--pass") i++;
      else open.push(command[i]);
    }
    return super.withCommand(open);
  }

  /** With a local engine, published on loopback only: the test NATS takes anonymous clients. */
  override async start() {
    if (loopbackOnly()) {
      for (const bindings of Object.values(this.hostConfig.PortBindings ?? {})) {
        for (const binding of (bindings ?? []) as { HostIp?: string }[]) binding.HostIp ??= "127.0.0.1";
      }
    }
    return super.start();
  }
}

/**
 * A local engine (a unix socket) with no TESTCONTAINERS_HOST_OVERRIDE: the container is
 * reached on 127.0.0.1. (testcontainers would pick the bridge's gateway wherever /.dockerenv
 * exists, as on machines that are themselves containers, and that address is not loopback.)
 */
function loopbackOnly(env = process.env): boolean {
  return (
    env.TESTCONTAINERS_HOST_OVERRIDE === undefined &&
    (env.DOCKER_HOST === undefined || env.DOCKER_HOST.startsWith("unix://"))
  );
}

export interface NatsContainerHandle {
  readonly url: string;
  stop(): Promise<void>;
}

export async function startNatsContainer(): Promise<NatsContainerHandle> {
  const container = await new OpenNatsContainer(NATS_IMAGE)
    .withJetStream()
    .withArg("--config", CONFIG_PATH)
    .withCopyContentToContainer([{ content: CONFIG, target: CONFIG_PATH }])
    .start();
  return {
    url: `nats://${loopbackOnly() ? "127.0.0.1" : container.getHost()}:${container.getMappedPort(4222)}`,
    async stop() {
      await container.stop();
    },
  };
}

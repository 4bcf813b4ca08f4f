// A NATS container with JetStream for the tests (testcontainers, @testcontainers/nats). Loaded
// by `nats.ts` only where no NATS_URL or local nats-server exists and a Docker engine answers.
import { NatsContainer } from "@testcontainers/nats";

/** The image; override with TEST_NATS_IMAGE. */
export const NATS_IMAGE = process.env.TEST_NATS_IMAGE || "nats:2.10-alpine";

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
    url: `nats://${container.getHost()}:${container.getMappedPort(4222)}`,
    async stop() {
      await container.stop();
    },
  };
}

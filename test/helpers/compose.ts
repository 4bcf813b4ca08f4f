// compose.yaml run by Docker Compose as a project of its own: generated passwords and API key,
// free loopback ports, and the docker and compose commands the container tests use.
import { execFile } from "node:child_process";
import { createServer } from "node:net";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { newApiKey } from "../../gateway/index.ts";

const root = fileURLToPath(new URL("../..", import.meta.url));

/** Runs a command; its stdout, or an error carrying stderr's last lines. */
export function run(
  command: string,
  args: readonly string[],
  options: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      command,
      args,
      { cwd: root, env: options.env ?? process.env, timeout: options.timeoutMs ?? 120_000, maxBuffer: 256 << 20 },
      (err, stdout, stderr) => {
        if (err)
          reject(
            new Error(
              `${command} ${args.join(" ")}: ${err.message}\n${String(stderr).split("\n").slice(-20).join("\n")}`,
            ),
          );
        else resolve(String(stdout));
      },
    );
  });
}

export const docker = (...args: string[]) => run("docker", args);

/** The compose command: DOCKER_COMPOSE (a path, or `docker compose`), else `docker compose`. */
function composeCommand(): [string, string[]] {
  const [command, ...args] = (process.env.DOCKER_COMPOSE || "docker compose").split(" ") as [string, ...string[]];
  return [command, args];
}

export interface ComposeProject {
  readonly name: string;
  /** Base URLs of the gateways' Task, Job and microVM APIs on 127.0.0.1. */
  readonly gateways: { task: string; job: string; microvm: string }[];
  /** NATS client URLs of the nodes, published on 127.0.0.1. */
  readonly nats: Record<string, string>;
  /** `.env`'s passwords by variable name. */
  readonly passwords: Record<string, string>;
  /** The API key the gateways take (`Authorization: Bearer <key>`). */
  readonly apiKey: string;
  compose(...args: string[]): Promise<string>;
  /** The container id of a service. */
  container(service: string): Promise<string>;
  /** Containers, networks and volumes of the project that still exist. */
  leftovers(): Promise<string[]>;
  /** `docker compose down -v` and the temporary files. */
  down(): Promise<void>;
}

/**
 * A free loopback port below Linux's ephemeral range (32768-60999): published by Docker seconds
 * later, a port from that range may meanwhile be taken as the local end of an outgoing connection.
 */
async function publishablePort(): Promise<number> {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    const server = createServer();
    server.listen(port, "127.0.0.1");
    const bound = await new Promise<boolean>((resolve) => {
      server.once("listening", () => resolve(true));
      server.once("error", () => resolve(false));
    });
    if (bound) {
      await new Promise((r) => server.close(r));
      return port;
    }
  }
}

/** Writes `.env` and `api-keys` for a project named `name` on free loopback ports. */
export async function composeProject(name: string, env: Record<string, string> = {}): Promise<ComposeProject> {
  const dir = await mkdtemp(join(tmpdir(), "compose-test-"));
  const passwords = Object.fromEntries(
    ["GATEWAY", "ACTORS", "MICROVMS", "INTERNAL", "PROVISION", "ROUTE"].map((role) => [
      `NATS_${role}_PASSWORD`,
      `pw${randomBytes(24).toString("hex")}`,
    ]),
  );
  const { key, line } = newApiKey("compose-test");
  await writeFile(join(dir, "api-keys"), `${line}\n`);
  const ports: Record<string, string> = {};
  const nats: Record<string, string> = {};
  for (const node of [1, 2, 3]) {
    const port = await publishablePort();
    ports[`NATS_${node}_PORT`] = String(port);
    nats[`nats-${node}`] = `nats://127.0.0.1:${port}`;
  }
  const gateways: ComposeProject["gateways"] = [];
  for (const gateway of [1, 2]) {
    const [task, job, microvm] = [await publishablePort(), await publishablePort(), await publishablePort()];
    Object.assign(ports, {
      [`GATEWAY_${gateway}_TASK_PORT`]: `127.0.0.1:${task}`,
      [`GATEWAY_${gateway}_JOB_PORT`]: `127.0.0.1:${job}`,
      [`GATEWAY_${gateway}_MICROVM_PORT`]: `127.0.0.1:${microvm}`,
    });
    gateways.push({
      task: `http://127.0.0.1:${task}`,
      job: `http://127.0.0.1:${job}`,
      microvm: `http://127.0.0.1:${microvm}`,
    });
  }
  const dotenv = { ...passwords, ...ports, API_KEYS_PATH: join(dir, "api-keys"), ...env };
  await writeFile(
    join(dir, ".env"),
    `${Object.entries(dotenv)
      .map(([k, v]) => `${k}=${v}`)
      .join("\n")}\n`,
  );
  const [command, prefix] = composeCommand();
  const compose = (...args: string[]) =>
    run(
      command,
      [
        ...prefix,
        "--project-name",
        name,
        "--env-file",
        join(dir, ".env"),
        "--file",
        join(root, "compose.yaml"),
        ...args,
      ],
      { timeoutMs: 300_000 },
    );
  const label = `label=com.docker.compose.project=${name}`;
  return {
    name,
    gateways,
    nats,
    passwords,
    apiKey: key,
    compose,
    async container(service) {
      const id = (await compose("ps", "--all", "--quiet", service)).trim();
      if (!id) throw new Error(`no container for ${service}`);
      return id;
    },
    async leftovers() {
      const lists = await Promise.all([
        docker("ps", "--all", "--quiet", "--filter", label),
        docker("network", "ls", "--quiet", "--filter", label),
        docker("volume", "ls", "--quiet", "--filter", label),
      ]);
      return lists.flatMap((list, i) =>
        list
          .split("\n")
          .filter(Boolean)
          .map((id) => `${["container", "network", "volume"][i]} ${id}`),
      );
    },
    async down() {
      await compose("down", "--volumes", "--remove-orphans", "--timeout", "5");
      await rm(dir, { recursive: true, force: true });
    },
  };
}

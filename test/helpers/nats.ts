// Test NATS, first that applies: `NATS_URL`; a private `nats-server -js` (the binary
// `natsServerPath()` resolves: NATS_SERVER_BIN, `.tools/`, PATH, /usr/sbin) on a free port
// with a temporary store; a NATS container (testcontainers) where a Docker engine answers; else
// an error naming the three. testcontainers is imported only on that path.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { request } from "node:http";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import {
  authorizationConfig,
  ensureNatsCredentials,
  findNatsServer,
  MIN_NATS_SERVER,
  startNatsServer,
  type NatsCredentials,
  type NatsRole,
  type NatsServer,
  type NatsServerBinary,
  publicKeyOf,
} from "../../platform/index.ts";
import * as nkeys from "@nats-io/nkeys";
import type { Defer } from "./defer.ts";

/** Where a test's NATS comes from. */
export type NatsSource = "env" | "local" | "testcontainers";

export interface TestNats {
  url: string;
  source: NatsSource;
  /** The private server, when the test owns a local one (restart tests need it). */
  server?: NatsServer;
  storeDir?: string;
  /** The generated per-role credentials (`NATS_AUTH_DIR`); absent when NATS takes anyone. */
  authDir?: string;
  /** The server's `authorization {}` block: pass it when starting the server again. */
  authorization?: string;
  /** Connect options as `role`; `admin` (tests only) may do anything, to set up and inspect. */
  login(role: TestRole): { servers: string; credentials?: NatsCredentials };
  /** Environment of a service process joining this NATS (`NATS_URL`, `NATS_AUTH_DIR`). */
  env(): Record<string, string>;
}

/** A service role, `internal`, or the tests' own all-powerful `admin`. */
export type TestRole = NatsRole | "admin";

export interface TestNatsOptions {
  /** An own server, to stop or restart it: never `NATS_URL`, and never a container. */
  private?: boolean;
  /** Start an own server without authorization (default: the generated config, `TEST_NATS_AUTH=0` turns it off). */
  anonymous?: boolean;
}

/** A NATS for a test file; `private` forces an own local server (to stop or restart it). */
export async function testNats(defer: Defer, options: TestNatsOptions = {}): Promise<TestNats> {
  const source = await natsSource({ private: options.private });
  if (source === "env") return open(process.env.NATS_URL!, source);
  if (source === "testcontainers") {
    if (options.private) throw new Error(RESTART_UNSUPPORTED);
    const { startNatsContainer } = await import("./nats-container.ts");
    const container = await startNatsContainer();
    defer(() => container.stop());
    return open(container.url, source);
  }
  const storeDir = await mkdtemp(join(tmpdir(), "nats-test-"));
  const auth = options.anonymous || process.env.TEST_NATS_AUTH === "0" ? undefined : await testAuth(storeDir);
  const server = await startNatsServer({ storeDir, authorization: auth?.config });
  defer(async () => {
    await server.stop();
    await rm(storeDir, { recursive: true, force: true });
  });
  return { ...open(server.url, source, auth), server, storeDir, authorization: auth?.config };
}

/** The service's generated credentials plus an `admin` user for the tests themselves. */
export async function testAuth(storeDir: string) {
  const dir = join(storeDir, "auth");
  const credentials: Record<TestRole, NatsCredentials> = {
    ...(await ensureNatsCredentials(dir)),
    admin: { nkeySeed: new TextDecoder().decode(nkeys.createUser().getSeed()) },
  };
  const admin = {
    nkey: publicKeyOf(credentials.admin.nkeySeed!),
    permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] }, allow_responses: true },
  };
  return { dir, credentials, config: authorizationConfig(credentials, "", [admin]) };
}

function open(
  url: string,
  source: NatsSource,
  auth?: { dir: string; credentials: Record<TestRole, NatsCredentials> },
): TestNats {
  return {
    url,
    source,
    authDir: auth?.dir,
    login: (role) => ({ servers: url, ...(auth ? { credentials: auth.credentials[role] } : {}) }),
    env: () => ({ NATS_URL: url, ...(auth ? { NATS_AUTH_DIR: auth.dir } : {}) }),
  };
}

const RESTART_UNSUPPORTED =
  "this test stops and restarts NATS on the same port and store, which needs a local nats-server " +
  "(a testcontainers NATS gets a new port when restarted); skip it with `if (await skipUnlessRestartable(t)) return;`";

/**
 * For a test that stops and restarts NATS (`testNats(defer, { private: true })`): skips `t`
 * with a printed reason where only testcontainers can provide NATS. True when skipped: return.
 */
export async function skipUnlessRestartable(
  t: { skip(message?: string): void; name?: string },
  env = process.env,
  findBinary?: NatsSourceOptions["findBinary"],
): Promise<boolean> {
  if ((await natsSource({ private: true, env, findBinary })) !== "testcontainers") return false;
  const reason = "needs a local nats-server to restart NATS (only testcontainers is available here)";
  console.log(`# skipped ${t.name ? `"${t.name}"` : "a test"}: ${reason}`);
  t.skip(reason);
  return true;
}

export interface NatsSourceOptions {
  private?: boolean;
  /** Environment to decide by (default `process.env`): NATS_URL, NATS_SERVER_BIN, PATH, DOCKER_HOST, HOME. */
  env?: NodeJS.ProcessEnv;
  /** Finds the local binary (default `findNatsServer`; a test of the choice replaces it). */
  findBinary?: (env: NodeJS.ProcessEnv) => NatsServerBinary | undefined;
}

/**
 * Which NATS the tests get: `NATS_URL` (unless private), else a local nats-server binary, else
 * testcontainers when a Docker engine answers. `TEST_NATS=local|testcontainers` forces one.
 * A local binary older than `MIN_NATS_SERVER` is still chosen: starting it fails with the
 * message that says how to get a current one.
 */
export async function natsSource(options: NatsSourceOptions = {}): Promise<NatsSource> {
  const env = options.env ?? process.env;
  if (env.TEST_NATS === "testcontainers") return "testcontainers";
  if (env.NATS_URL && !options.private && env.TEST_NATS !== "local") return "env";
  if ((options.findBinary ?? findNatsServer)(env)) return "local";
  if (env.TEST_NATS !== "local" && (await dockerEngine(env))) return "testcontainers";
  throw new Error(
    "no NATS for the tests: set NATS_URL to a NATS server with JetStream, " +
      `or get nats-server >= ${MIN_NATS_SERVER.join(".")} ` +
      "(scripts/get-nats-server.sh), or start a Docker engine for testcontainers " +
      `(none answered at ${dockerCandidates(env).join(", ")})`,
  );
}

/** Where a Docker engine may listen, as testcontainers looks: DOCKER_HOST, else the usual sockets. */
function dockerCandidates(env: NodeJS.ProcessEnv): string[] {
  if (env.DOCKER_HOST) return [env.DOCKER_HOST];
  const home = env.HOME ?? homedir();
  const uid = process.getuid?.() ?? 0;
  return [
    "unix:///var/run/docker.sock",
    ...(env.XDG_RUNTIME_DIR ? [`unix://${env.XDG_RUNTIME_DIR}/docker.sock`] : []),
    `unix://${home}/.docker/run/docker.sock`,
    `unix://${home}/.docker/desktop/docker.sock`,
    `unix:///run/user/${uid}/docker.sock`,
  ];
}

/** The first candidate whose engine answers `GET /_ping` (a TLS endpoint is taken on trust). */
export async function dockerEngine(env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  const configured = await readFile(join(env.HOME ?? homedir(), ".testcontainers.properties"), "utf8").catch(() => "");
  const fromProperties = /^docker\.host\s*=\s*(\S+)/m.exec(configured)?.[1];
  const candidates = fromProperties && !env.DOCKER_HOST ? [fromProperties] : dockerCandidates(env);
  for (const candidate of candidates) {
    if (candidate.startsWith("tcp://") && env.DOCKER_TLS_VERIFY) return candidate;
    if (await pings(candidate)) return candidate;
  }
  return undefined;
}

function pings(endpoint: string): Promise<boolean> {
  const target = endpoint.startsWith("unix://")
    ? { socketPath: endpoint.slice("unix://".length) }
    : endpoint.startsWith("tcp://")
      ? { host: new URL(endpoint).hostname, port: Number(new URL(endpoint).port || 2375) }
      : undefined;
  if (!target) return Promise.resolve(false);
  return new Promise((resolve) => {
    const req = request({ ...target, path: "/_ping", timeout: 1_500 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}

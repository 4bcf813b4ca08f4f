// The system under test, each part its own process: a private `nats-server -js` on a temp
// store with the generated per-role users (as `npm start` runs it; NATS_SYNC as the caller's,
// else 1s), the service (`main.ts`, one process or gateway + actors apart) on free ports it
// reports, the bare node:http baseline, the same service on an anonymous nats-server (auth off,
// for the `:noauth` rows) and, for the `:always` workloads, a second authenticated nats-server
// with NATS_SYNC=always and its own one-process service; for the `:r3` workloads, two 3-node
// clusters (R3 buckets), one per NATS_SYNC (`1s`, `always`), each with its own one-process
// service; for the `anchor:` workloads, the no-hop anchor (anchor-server.ts) on the main stack's
// nats-server with a login of its own; for the list rows, one stack per list size holding only
// what those rows seed. With `natsBinary`, every nats-server of it runs that
// binary (`--nats-compare`); with `checkout`, every service runs that checkout's main.ts
// (`--service-compare`).
// `close()` stops them all and removes the stores.
import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  authDirOf,
  authorizationConfig,
  connectNats,
  ensureNatsCredentials,
  parseNatsSync,
  type NatsHandle,
  type NkeyUser,
  type Requester,
} from "../platform/index.ts";
import type { RoleSet } from "../cluster/index.ts";
import { anchorEnv, anchorLogin } from "./anchor.ts";
import { exitedChildren, runningPids, stopAll, tempDir, type Child } from "./children.ts";
import { callerEnv, profileFlags, startBuiltServer, startNats, startNatsR3, startService } from "./stacks.ts";
import type { ProcessGroups } from "./types.ts";

/** Whose RSS and CPU count as "service" (and "nats") for a row. */
export type ServiceGroup =
  | "service"
  | "bare"
  | "anchor"
  | "always"
  | "noAuth"
  | "traced"
  | "r3"
  | "r3Always"
  | "lists1k"
  | "lists100k";

/** The sizes the list rows measure at, each on a stack of its own (records of each kind). */
export const listScales = { "1k": 1_000, "100k": 100_000 } as const;
export type ListScale = keyof typeof listScales;

export interface EnvironmentOptions {
  /** Run the gateway and the actors as two processes instead of one. */
  splitRoles: boolean;
  /** Directory for `node --cpu-prof` profiles of the service process(es). */
  cpuProfDir?: string;
  /** Extra node flags for the service processes. */
  nodeFlags?: string[];
  /** Also start the NATS_SYNC=always stack (nats-server + service). */
  syncAlways: boolean;
  /** Also start the R3 stacks (a 3-node cluster + service, for NATS_SYNC 1s and always). */
  r3: boolean;
  /** Also start the same service with tracing on, exporting every span to an OTLP sink here. */
  traced?: boolean;
  /** Another nats-server binary for every server of this environment (default: `natsServerPath()`). */
  natsBinary?: string;
  /** Also start the no-hop anchor (polka straight to KV) on the main stack's nats-server. */
  anchor?: boolean;
  /** Another checkout whose `main.ts` every service of this environment runs (`--service-compare`). */
  checkout?: string;
  /** Also start the list rows' stacks (one per `listScales` size), each with a connection that may seed it. */
  lists?: boolean;
}

/** A list rows' stack: its Task API, and a connection of the actors' user that writes its records. */
export interface ListStack {
  taskUrl: string;
  requester: Requester;
}

/** The NATS_SYNC=always stack's API URLs. */
export interface AlwaysStack {
  taskUrl: string;
  jobUrl: string;
}

export interface Environment {
  natsUrl: string;
  /** nats-server's temporary store (removed by `close()`). */
  storeDir: string;
  taskUrl: string;
  jobUrl: string;
  bareUrl: string;
  /** The no-hop anchor's Task-like API, when started. */
  anchorUrl?: string;
  /** The NATS_SYNC=always stack, when started. */
  always?: AlwaysStack;
  /** The R3 stacks by NATS_SYNC, when started. */
  r3?: { "1s": AlwaysStack; always: AlwaysStack };
  /** The Task API of the same service with NATS auth off (its own anonymous nats-server). */
  noAuthTaskUrl: string;
  /** The same service with tracing on (OTLP/HTTP to a sink in the bench), when started. */
  traced?: { taskUrl: string; jobUrl: string; exported(): { requests: number; bytes: number } };
  /** The list rows' stacks by size, when started. */
  lists?: Record<ListScale, ListStack>;
  /** The bench's own connection (noAsyncTraces on) for direct NATS load and seeding. */
  nc: NatsConnection;
  /** Pids of a row's `service` (main.ts processes, or the bare server) and `nats` processes. */
  groups(serviceGroup: ServiceGroup): ProcessGroups;
  /** Which of the system's processes have died (a crash mid-run explains a failing row). */
  deaths(): string[];
  close(): Promise<void>;
}

/**
 * The one-process service: the Task and Job APIs and their actors. No workload here uses the
 * microVM host (`--microvm` measures it), so its start-up and idle timers stay out of the figures.
 */
const ONE_PROCESS: RoleSet = ["gateway", "actors"];

/** One nats-server (or 3-node cluster) and the service on it. */
interface Stack {
  nats: Child[];
  service: Child[];
  taskUrl: string;
  jobUrl: string;
}

const pidsOf = (children: Child[] | undefined) => children?.map((c) => c.pid) ?? [];

/**
 * The users' permissions a checkout's services expect (its `authorizationConfig`): another
 * checkout may read or write other subjects and buckets than this one.
 */
export async function permissionsOf(checkout: string | undefined): Promise<typeof authorizationConfig> {
  if (!checkout) return authorizationConfig;
  const module = pathToFileURL(resolve(checkout, "platform/nats-auth.ts")).href;
  return ((await import(module)) as { authorizationConfig: typeof authorizationConfig }).authorizationConfig;
}

export async function startEnvironment(options: EnvironmentOptions): Promise<Environment> {
  const store = await tempDir("bench-nats-");
  const storeDir = store.path;
  // An environment started before this one (the `--nats-compare` one after the main) keeps its processes.
  const earlier = runningPids();
  let handle: NatsHandle | undefined;
  const listHandles: NatsHandle[] = [];
  let sink: OtlpSink | undefined;
  const close = async () => {
    await handle?.close().catch(() => {});
    for (const h of listHandles) await h.close().catch(() => {});
    await sink?.close();
    await stopAll(5_000, earlier);
    await store.remove();
  };
  try {
    const authDir = authDirOf(storeDir);
    const credentials = await ensureNatsCredentials(authDir);
    const authorizationOf = await permissionsOf(options.checkout);
    const authorization = authorizationOf(credentials);
    const binary = options.natsBinary;
    const nodeFlags = [...(options.nodeFlags ?? []), ...profileFlags(options.cpuProfDir)];
    const anchor = options.anchor ? await anchorLogin(authDir) : undefined;
    // Every authenticated server names the same generated users (the same public keys); `users`: more.
    const stack = async (
      name: string,
      dir: string,
      nats: { sync: string; auth: boolean; r3?: boolean; users?: NkeyUser[] },
      roleSets: RoleSet[] = [ONE_PROCESS],
      env: Record<string, string> = {},
    ): Promise<Stack & { natsUrl: string }> => {
      const natsDir = join(storeDir, `${dir}-nats`);
      const auth = nats.users ? authorizationOf(credentials, "", nats.users) : authorization;
      const server = nats.r3
        ? await startNatsR3(natsDir, { sync: nats.sync, authorization: auth, credentials, binary })
        : await startNats(natsDir, { sync: nats.sync, authorization: nats.auth ? auth : undefined, binary });
      const natsUrl = "server" in server ? server.server.url : server.url;
      const service = await startService({
        name,
        natsUrl,
        dataDir: join(storeDir, `${dir}-data`),
        roleSets,
        nodeFlags,
        authDir: nats.auth ? authDir : undefined,
        env: { ...(nats.r3 ? { KV_REPLICAS: "3" } : {}), ...env },
        checkout: options.checkout,
      });
      const natsChildren = "child" in server ? [server.child] : server.children;
      return {
        nats: natsChildren,
        service: service.children,
        taskUrl: service.taskUrl,
        jobUrl: service.jobUrl,
        natsUrl,
      };
    };
    const main = await stack(
      "service",
      "main",
      { sync: mainSync(), auth: true, users: anchor && [anchor.user] },
      options.splitRoles ? ["actors", "gateway"] : [ONE_PROCESS],
    );
    const always = options.syncAlways
      ? await stack("service (sync always)", "always", { sync: "always", auth: true })
      : undefined;
    const r3 = options.r3 ? await stack("service (R3, 1s)", "r3-1s", { sync: "1s", auth: true, r3: true }) : undefined;
    const r3Always = options.r3
      ? await stack("service (R3, always)", "r3-always", { sync: "always", auth: true, r3: true })
      : undefined;
    const { child: bare, port: barePort } = await startBuiltServer("bare", "bench/bare-server.ts", callerEnv());
    // The same writes and reads with no actor hop, on the main stack's nats-server (its NATS_SYNC).
    const anchorServer =
      anchor &&
      (await startBuiltServer("anchor", "bench/anchor-server.ts", {
        ...callerEnv(),
        ...anchorEnv(main.natsUrl, anchor),
      }));
    // The same service with NATS auth off, for the auth cost in the same run.
    const noAuth = await stack("service noauth", "noauth", { sync: mainSync(), auth: false });
    // The same service exporting every span (OTLP/HTTP), for tracing's cost in the same run.
    sink = options.traced ? await startOtlpSink() : undefined;
    const traced = sink
      ? await stack("service (traced)", "traced", { sync: mainSync(), auth: true }, [ONE_PROCESS], {
          OTEL_EXPORTER_OTLP_ENDPOINT: sink.url,
        })
      : undefined;
    // The list rows' stacks, each holding only what its rows seed.
    const listStack = async (scale: ListScale) => {
      const started = await stack(`service (lists ${scale})`, `lists-${scale}`, { sync: mainSync(), auth: true });
      const seeder = await connectNats({
        servers: started.natsUrl,
        name: `bench-lists-${scale}`,
        credentials: credentials.actors,
      });
      listHandles.push(seeder);
      return { ...started, requester: seeder.requester };
    };
    const lists1k = options.lists ? await listStack("1k") : undefined;
    const lists100k = options.lists ? await listStack("100k") : undefined;
    // Direct NATS load runs as another service would: the `internal` user.
    handle = await connectNats({ servers: main.natsUrl, name: "bench", credentials: credentials.internal });
    const stacks: Partial<Record<ServiceGroup, Stack>> = {
      service: main,
      always,
      noAuth,
      traced,
      r3,
      r3Always,
      lists1k,
      lists100k,
    };
    const own = { bare: bare.pid, anchor: anchorServer?.child.pid };
    const children = [
      bare,
      ...(anchorServer ? [anchorServer.child] : []),
      ...Object.values(stacks).flatMap((s) => (s ? [...s.nats, ...s.service] : [])),
    ];
    const urls = (s: Stack) => ({ taskUrl: s.taskUrl, jobUrl: s.jobUrl });
    return {
      natsUrl: main.natsUrl,
      storeDir,
      taskUrl: main.taskUrl,
      jobUrl: main.jobUrl,
      bareUrl: `http://127.0.0.1:${barePort}`,
      anchorUrl: anchorServer && `http://127.0.0.1:${anchorServer.port}`,
      always: always && urls(always),
      r3: r3 && r3Always && { "1s": urls(r3), always: urls(r3Always) },
      noAuthTaskUrl: noAuth.taskUrl,
      traced: traced && sink && { ...urls(traced), exported: sink.exported },
      lists: lists1k &&
        lists100k && {
          "1k": { taskUrl: lists1k.taskUrl, requester: lists1k.requester },
          "100k": { taskUrl: lists100k.taskUrl, requester: lists100k.requester },
        },
      nc: handle.nc,
      groups: (group) => {
        // The bare and anchor rows: their server, and the main stack's nats-server.
        if (group === "bare" || group === "anchor")
          return { service: own[group] ? [own[group]] : [], nats: pidsOf(main.nats) };
        return { service: pidsOf(stacks[group]?.service), nats: pidsOf(stacks[group]?.nats) };
      },
      deaths: () => exitedChildren(children),
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

/** NATS_SYNC of the main stack: the caller's NATS_SYNC (to compare another interval), else 1s. */
export function mainSync(): string {
  return parseNatsSync(process.env.NATS_SYNC);
}

interface OtlpSink {
  url: string;
  exported(): { requests: number; bytes: number };
  close(): Promise<void>;
}

/** An OTLP/HTTP endpoint that takes every export and keeps only its count and size. */
async function startOtlpSink(): Promise<OtlpSink> {
  let requests = 0;
  let bytes = 0;
  const server = createServer((req, res) => {
    req.on("data", (chunk: Buffer) => (bytes += chunk.length));
    req.on("end", () => {
      requests += 1;
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    exported: () => ({ requests, bytes }),
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

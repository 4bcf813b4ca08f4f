// The service's configuration: every environment variable and flag `npm start` reads, checked
// once before anything starts. A bad value is one line naming the variable, what it must be
// and what it got (`ConfigError`); `configVariables` lists every variable read, for the docs.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import type { ProviderName } from "./vm-runtime/service/index.ts";
import { parseNatsSync } from "./platform/index.ts";

/** A value of the configuration that cannot be used; its message is the one-line fix. */
export class ConfigError extends Error {
  override name = "ConfigError";
  /** The process's exit status for it: 2 for a command line that does not parse, else 1. */
  readonly exitCode: number;
  constructor(message: string, exitCode = 1) {
    super(message);
    this.exitCode = exitCode;
  }
}

function fail(message: string): never {
  throw new ConfigError(message);
}

/** The roles a process runs: the HTTP gateway, the task/job actors, the microVM host. */
export const roles = ["gateway", "actors", "microvms"] as const;
export type Role = (typeof roles)[number];

const providers = ["auto", "gvisor", "sandbox", "process"] as const satisfies readonly ProviderName[];

/** Typed reads of `env`, each with the checks and messages of its kind. */
function reader(env: NodeJS.ProcessEnv) {
  const raw = (name: string) => {
    configVariables.add(name);
    const value = env[name];
    return value === undefined || value === "" ? undefined : value;
  };
  const int = (name: string, fallback: number): number => {
    const value = raw(name);
    if (value === undefined) return fallback;
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0) fail(`${name} must be a non-negative integer, got "${value}"`);
    return n;
  };
  return {
    /** A string; `fallback` when unset or empty. */
    text: (name: string, fallback?: string) => raw(name) ?? fallback,
    /** A string that may be set empty (an empty prefix is no prefix). */
    textOrEmpty: (name: string, fallback: string) => {
      configVariables.add(name);
      return env[name] ?? fallback;
    },
    int,
    /** An integer above 0; `fallback` when unset. */
    positive: (name: string, fallback: number) => int(name, fallback) || fail(`${name} must be positive`),
    /** An integer above 0, or undefined when unset. */
    optionalPositive: (name: string) =>
      raw(name) === undefined ? undefined : int(name, 0) || fail(`${name} must be positive`),
    /** A non-negative integer, or undefined when unset. */
    optionalInt: (name: string) => (raw(name) === undefined ? undefined : int(name, 0)),
    /** A TCP port: 0 (any free one) to 65535. */
    port: (name: string, fallback: number) => {
      const value = int(name, fallback);
      if (value > 65535) fail(`${name} must be a port from 0 to 65535 (0 picks a free one), got "${env[name]}"`);
      return value;
    },
    /** A CPU quota in cores: a positive number such as 0.5 or 2; undefined when unset. */
    cores: (name: string) => {
      const value = raw(name);
      if (value === undefined) return undefined;
      const n = Number(value);
      if (!Number.isFinite(n) || n < 0.01 || n > 1024)
        fail(`${name} must be a number of cores such as 0.5, got "${value}"`);
      return n;
    },
    /** `1` turns it on. */
    on: (name: string) => raw(name) === "1",
    /** `0` turns it off. */
    off: (name: string) => raw(name) === "0",
    /** A comma-separated list of lower-case names. */
    names: (name: string) =>
      (raw(name) ?? "")
        .split(",")
        .map((h) => h.trim().toLowerCase())
        .filter(Boolean),
  };
}

/** Every environment variable `readConfig` reads (filled as it reads them). */
export const configVariables = new Set<string>();

/** The configuration of `npm start` from `env`; a bad value throws a `ConfigError`. */
export function readConfig(env: NodeJS.ProcessEnv) {
  const v = reader(env);
  const service = {
    natsUrl: v.text("NATS_URL"),
    dataDir: resolve(v.text("DATA_DIR", ".data")!),
    natsPort: v.port("NATS_PORT", 0),
    host: v.text("HOST", "127.0.0.1")!,
    taskPort: v.port("TASK_API_PORT", 8787),
    jobPort: v.port("JOB_API_PORT", 8788),
    microvmPort: v.port("MICROVM_API_PORT", 8789),
    prefix: v.textOrEmpty("NATS_SUBJECT_PREFIX", ""),
    bodyLimit: v.int("BODY_LIMIT_BYTES", 1024 * 1024),
    requestTimeoutMs: v.int("REQUEST_TIMEOUT_MS", 5_000),
    replicas: v.int("KV_REPLICAS", 1),
    localReads: !v.off("GATEWAY_LOCAL_READS"),
    metricsPort: v.text("METRICS_PORT") === undefined ? undefined : v.port("METRICS_PORT", 0),
    readCacheEntries: v.int("READ_CACHE_ENTRIES", 50_000),
    /** The private server's JetStream sync_interval (ignored with NATS_URL: that server has its own). */
    natsSync: natsSync(v.text("NATS_SYNC")),
    /** `<principal> <sha256 hex of key>` lines; when set, every API needs a bearer key. */
    apiKeysFile: v.text("API_KEYS_FILE"),
    /**
     * Whose tasks, task objects and jobs a request on the public NATS subjects sees (role
     * `actors`); unset: `nats:internal` with API_KEYS_FILE set, else the anonymous principal.
     */
    taskNatsPrincipal: v.text("TASK_NATS_PRINCIPAL"),
    /** `Host` names every API answers to besides localhost, 127.0.0.1 and ::1. */
    hostNames: v.names("API_HOSTNAMES"),
    /** Further `Host` names only the microVM API answers to. */
    microvmHostNames: v.names("MICROVM_API_HOSTNAMES"),
  };
  /** Task-object placement (role `actors`): lease TTL and idle release. */
  const placement = {
    ttlMs: v.positive("TASK_OBJECT_LEASE_MS", 2_000),
    idleMs: v.int("TASK_OBJECT_IDLE_MS", 30_000),
    logWrites: v.on("TASK_OBJECT_LOG_WRITES"),
    maxPending: v.positive("TASK_OBJECT_MAX_PENDING", 256),
  };
  /** The microVM host (role `microvms`). The token secret is never logged. */
  const microvmHost = {
    hostId: v.text("MICROVM_HOST_ID"),
    tokenSecret: v.text("MICROVM_TOKEN_SECRET"),
    tokenSecretPrevious: v.text("MICROVM_TOKEN_SECRET_PREVIOUS"),
    maxInstances: v.int("MICROVM_MAX_INSTANCES", 50),
    quotaPerPrincipal: v.int("MICROVM_QUOTA_PER_PRINCIPAL", 10),
    imageCacheMiB: v.positive("MICROVM_IMAGE_CACHE_MIB", 256),
    /** Stored image versions and MiB per principal, old versions included (429 past either). */
    imageQuota: {
      versions: v.positive("MICROVM_IMAGE_QUOTA_VERSIONS", 50),
      bytes: v.positive("MICROVM_IMAGE_QUOTA_MIB", 64) * 1024 * 1024,
    },
    /** `max_bytes` of the image object store: images never take the task and job buckets' space. */
    imageStoreMiB: v.positive("MICROVM_IMAGE_STORE_MIB", 1024),
    /** Suspend stores a snapshot where the provider checkpoints (gVisor); `0` keeps the freezer. */
    snapshots: !v.off("MICROVM_SNAPSHOTS"),
    snapshotQuotaMiB: v.positive("MICROVM_SNAPSHOT_QUOTA_MIB", 256),
    snapshotStoreMiB: v.positive("MICROVM_SNAPSHOT_STORE_MIB", 1024),
    /** Objects active on this host at once, all principals' and one principal's (docs/objects.md). */
    objects: {
      maxActive: v.positive("MICROVM_OBJECTS_MAX_ACTIVE", 50),
      maxActivePerPrincipal: v.positive("MICROVM_OBJECTS_PER_PRINCIPAL", 10),
    },
    /** Instance logs: lines kept per instance, their age, the stream's size. */
    logLimits: {
      linesPerInstance: v.positive("MICROVM_LOG_LINES", 1000),
      maxAgeSeconds: v.positive("MICROVM_LOG_MAX_AGE_SECONDS", 86_400),
      storeMiB: v.positive("MICROVM_LOG_STORE_MIB", 256),
    },
    /** The principal of callers on the public `microvms.<op>` subjects (the NATS user allowed there). */
    natsPrincipal: v.text("MICROVM_NATS_PRINCIPAL"),
    retentionSeconds: v.int("MICROVM_RETENTION_SECONDS", 600),
    proxyHost: v.text("MICROVM_PROXY_HOST", "127.0.0.1")!,
    proxyBindHost: v.text("MICROVM_PROXY_BIND"),
    provider: providerName(v.text("MICROVM_PROVIDER")),
    limits: {
      memoryMiB: v.optionalPositive("MICROVM_MEMORY_MIB"),
      cpus: v.cores("MICROVM_CPUS"),
      totalCpus: v.cores("MICROVM_TOTAL_CPUS"),
      totalMemoryMiB: v.optionalPositive("MICROVM_TOTAL_MEMORY_MIB"),
      uidBase: v.optionalInt("MICROVM_UID_BASE"),
      warmInstances: v.optionalInt("MICROVM_WARM_INSTANCES"),
      bootSlots: v.optionalPositive("MICROVM_BOOT_SLOTS"),
      launchSnapshots: !v.off("MICROVM_LAUNCH_SNAPSHOTS"),
      pids: v.optionalPositive("MICROVM_PIDS"),
      scratchMiB: v.optionalPositive("MICROVM_SCRATCH_MIB"),
    },
  };
  return { service, placement, microvmHost };
}

export type ServiceConfig = ReturnType<typeof readConfig>;

function natsSync(raw: string | undefined): string {
  try {
    return parseNatsSync(raw);
  } catch (err) {
    fail((err as Error).message);
  }
}

function providerName(raw: string | undefined): ProviderName {
  if (raw === undefined) return "auto";
  if ((providers as readonly string[]).includes(raw)) return raw as ProviderName;
  fail(
    `MICROVM_PROVIDER must be "auto" (default: gvisor, else sandbox), "gvisor", "sandbox" or "process", got "${raw}"`,
  );
}

export const usage = `usage: npm start [-- --role gateway|actors|microvms|all ...]

Runs the Task API, the Job API, the microVM API and their actors on NATS. Without NATS_URL it
starts a private nats-server with its data in DATA_DIR (.data); one such service per DATA_DIR.

  --role <r>   run only these roles (repeat or comma-separate); default all
  --provision  make the stores of these roles on the NATS at NATS_URL (or bring them up to
               date) with the provisioning credential (NATS_PROVISION_*), then exit
  --help       this text
  --version    the version

env (every variable: docs/operations.md; the microVM host's: docs/microvms.md#configuration):
NATS_URL, DATA_DIR, HOST, TASK_API_PORT, JOB_API_PORT, MICROVM_API_PORT, LOG_LEVEL
(fatal..trace), LOG_FORMAT (json|pretty; default pretty on a terminal), NATS_SYNC,
API_KEYS_FILE, MICROVM_PROVIDER (auto|gvisor|sandbox|process), MICROVM_RUNSC (docs/sandbox.md).`;

/** What the command line asks for: help, the version, or the roles to run. */
export type Flags =
  | { readonly kind: "help" }
  | { readonly kind: "version" }
  | {
      readonly kind: "run";
      readonly roles: ReadonlySet<Role>;
      /** True when `--role` named the roles (then each must start, or the process fails). */
      readonly explicit: boolean;
      /** `--provision`: make the roles' stores, then exit (nothing is served). */
      readonly provisionOnly: boolean;
    };

/** Reads the flags of `args`; an unknown flag or role throws a `ConfigError`. */
export function readFlags(args: string[]): Flags {
  let values: { role?: string[]; help?: boolean; version?: boolean; provision?: boolean };
  try {
    ({ values } = parseArgs({
      args,
      options: {
        role: { type: "string", multiple: true },
        provision: { type: "boolean" },
        help: { type: "boolean", short: "h" },
        version: { type: "boolean", short: "v" },
      },
    }));
  } catch (err) {
    throw new ConfigError(`${(err as Error).message} (npm start -- --help)`, 2);
  }
  if (values.help) return { kind: "help" };
  if (values.version) return { kind: "version" };
  const asked = (values.role ?? []).flatMap((r) => r.split(","));
  const explicit = asked.length > 0 && !asked.includes("all");
  const provisionOnly = values.provision === true;
  if (!explicit) return { kind: "run", roles: new Set(roles), explicit, provisionOnly };
  for (const r of asked) if (!roles.includes(r as Role)) fail(`unknown role "${r}" (use ${roles.join(", ")} or all)`);
  return { kind: "run", roles: new Set(asked as Role[]), explicit, provisionOnly };
}

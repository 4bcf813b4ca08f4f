// NATS credentials and least-privilege permissions: one nkey user per role (gateway, actors,
// microVM host, internal, and the provisioning step that makes the streams), seeds generated
// once into a 0700 directory as 0600 files, and the `authorization {}` block of the private
// server's config (public keys only, no secret).
import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import * as nkeys from "@nats-io/nkeys";
import {
  allOperations,
  isOwned,
  ownerSubjects,
  SERVICE_API_PREFIX,
  sendsPrincipal,
  serviceControlSubjects,
  serviceNames,
  servingRole,
  subscriptionSubject,
  viaGateway,
} from "../schemas/index.ts";
import {
  actorBuckets,
  bucketNames,
  indexedBuckets,
  imageObjectBucket,
  instanceLogStream,
  instanceLogSubjects,
  jobsCreatedSubject,
  recordChangesSubject,
  snapshotObjectBucket,
  type BucketName,
} from "./buckets.ts";
import { heldCancelSubject } from "./held-requests.ts";
import { indexStreamOf, indexSubjectsOf } from "./record-index.ts";
import {
  OBJECT_ALARMS_CONSUMER,
  OBJECT_ALARMS_STREAM,
  OBJECT_USAGE_STREAM,
  OBJECT_USAGE_SUBJECTS,
  OBJECTS_BUCKET,
  objectStreams,
} from "./object-streams.ts";

/**
 * The NATS users of the service; `internal` is for other services. `provision` makes the
 * streams and brings their configuration up to date at start, and is then closed: no running
 * role holds it, and none may create, update or delete a stream.
 */
export const natsRoles = ["gateway", "actors", "microvms", "internal", "provision"] as const;
export type NatsRole = (typeof natsRoles)[number];

/** How one connection authenticates; nothing here is ever logged. */
export interface NatsCredentials {
  /** Seed of an nkey user (the generated credentials). */
  readonly nkeySeed?: string;
  /** Contents of a `.creds` file (user JWT and seed) for an operator-mode NATS. */
  readonly creds?: string;
  readonly user?: string;
  readonly pass?: string;
  /** Reply subjects go below `<inboxPrefix>.`: the only inboxes this user may subscribe. */
  readonly inboxPrefix?: string;
}

/** `_INBOX_<role>`: replies to one role never reach another's subscriptions. */
export const inboxPrefixOf = (role: NatsRole) => `_INBOX_${role}`;

/** The seed file of `role` in an auth directory. */
export const seedFile = (dir: string, role: NatsRole) => join(dir, `${role}.nk`);

/** Reads the role seeds in `dir`, generating the missing ones (0600 files in a 0700 directory). */
export async function ensureNatsCredentials(dir: string): Promise<Record<NatsRole, NatsCredentials>> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const entries = await Promise.all(
    natsRoles.map(async (role) => {
      const path = seedFile(dir, role);
      let seed = (await readFile(path, "utf8").catch(() => "")).trim();
      if (!seed) {
        seed = new TextDecoder().decode(nkeys.createUser().getSeed());
        await writeFile(path, `${seed}\n`, { mode: 0o600, flag: "w" });
      }
      await chmod(path, 0o600);
      return [role, { nkeySeed: seed, inboxPrefix: inboxPrefixOf(role) }] as const;
    }),
  );
  return Object.fromEntries(entries) as Record<NatsRole, NatsCredentials>;
}

/** The credentials of `role` from an auth directory written by `ensureNatsCredentials`. */
export async function readNatsCredentials(dir: string, role: NatsRole): Promise<NatsCredentials | undefined> {
  const seed = (await readFile(seedFile(dir, role), "utf8").catch(() => "")).trim();
  return seed ? { nkeySeed: seed, inboxPrefix: inboxPrefixOf(role) } : undefined;
}

/** The public key of an nkey seed (what the server config names). */
export function publicKeyOf(seed: string): string {
  return nkeys.fromSeed(new TextEncoder().encode(seed)).getPublicKey();
}

export interface Permissions {
  readonly publish: { readonly allow: readonly string[] };
  readonly subscribe: { readonly allow: readonly string[] };
  /** Answer the requests received (publish to their reply subject once). */
  readonly allow_responses?: boolean;
}

/** The buckets each role writes. */
const ACTOR_BUCKETS = actorBuckets.map((key) => bucketNames[key]);
const HOST_BUCKETS = [bucketNames.microvms, bucketNames.images];
const INDEXED_BUCKETS = indexedBuckets.map((key) => bucketNames[key]);

/**
 * Every stream of the service: what the provisioning step makes, and no running role may
 * create, update or delete.
 */
export const serviceStreams: readonly string[] = [
  ...(Object.keys(bucketNames) as BucketName[]).map((key) => `KV_${bucketNames[key]}`),
  `OBJ_${imageObjectBucket}`,
  `OBJ_${snapshotObjectBucket}`,
  instanceLogStream,
  ...INDEXED_BUCKETS.map(indexStreamOf),
  ...objectStreams,
];

/**
 * Reading a bucket: direct gets, the last-message fallback, and its stream info (the change
 * feed's check, the open's existence check).
 */
function kvRead(bucket: string): string[] {
  const stream = `KV_${bucket}`;
  return [
    `$JS.API.DIRECT.GET.${stream}`,
    `$JS.API.DIRECT.GET.${stream}.>`,
    `$JS.API.STREAM.MSG.GET.${stream}`,
    `$JS.API.STREAM.INFO.${stream}`,
  ];
}

/**
 * Owning a bucket: read, and write its keys. Never its stream's configuration: a role that
 * could update a stream could add any subject to it (another role's inbox) or another stream
 * as its source, since permissions see the subject of a request, not its payload.
 */
export function kvOwn(bucket: string): string[] {
  return [...kvRead(bucket), `$KV.${bucket}.>`];
}

/**
 * Owning a bucket's index stream (record-index.ts): add entries, read them by direct gets,
 * remove one (a deleted record's entry: a message delete names its stream in the subject, so
 * it reaches no other stream). The stream itself is made by the provisioning step.
 */
function indexOwn(bucket: string): string[] {
  const stream = indexStreamOf(bucket);
  return [
    indexSubjectsOf(bucket),
    `$JS.API.DIRECT.GET.${stream}`,
    `$JS.API.DIRECT.GET.${stream}.>`,
    `$JS.API.STREAM.MSG.DELETE.${stream}`,
  ];
}

/**
 * Owning an object store bucket: put (chunks and meta), read (meta from the leader, chunks by
 * direct gets, objects listed from the stream info: no consumer) and purge (a delete purges the
 * object's chunk subject, within this stream only). No consumer create: a push consumer may
 * name any deliver subject, which permissions cannot see.
 */
function objOwn(bucket: string): string[] {
  const stream = `OBJ_${bucket}`;
  return [
    `$O.${bucket}.>`,
    ...[`INFO`, `PURGE`, `MSG.GET`].map((api) => `$JS.API.STREAM.${api}.${stream}`),
    `$JS.API.DIRECT.GET.${stream}`,
    `$JS.API.DIRECT.GET.${stream}.>`,
  ];
}

/**
 * Owning the instance log stream: write lines (core publishes it captures), read by direct
 * gets (no consumer), purge an instance's lines when its record goes (within this stream only).
 */
function logStreamOwn(): string[] {
  return [
    instanceLogSubjects,
    ...[`INFO`, `PURGE`].map((api) => `$JS.API.STREAM.${api}.${instanceLogStream}`),
    `$JS.API.DIRECT.GET.${instanceLogStream}`,
    `$JS.API.DIRECT.GET.${instanceLogStream}.>`,
  ];
}

/**
 * Objects (vm-runtime/objects): their bucket (leases and storage, and the purge of a deleted
 * object's keys, within that stream), add to and read the usage counters, set, read and cancel
 * (purge) alarm schedules, and take firing alarms from the consumer the provisioning step made
 * (next, info, acks): no consumer create, no stream change.
 */
function objectsOwn(): string[] {
  const direct = (stream: string) => [`$JS.API.DIRECT.GET.${stream}`, `$JS.API.DIRECT.GET.${stream}.>`];
  return [
    ...kvOwn(OBJECTS_BUCKET),
    `$JS.API.STREAM.PURGE.KV_${OBJECTS_BUCKET}`,
    OBJECT_USAGE_SUBJECTS,
    ...direct(OBJECT_USAGE_STREAM),
    "objalarm.sched.>",
    ...direct(OBJECT_ALARMS_STREAM),
    `$JS.API.STREAM.PURGE.${OBJECT_ALARMS_STREAM}`,
    `$JS.API.CONSUMER.MSG.NEXT.${OBJECT_ALARMS_STREAM}.${OBJECT_ALARMS_CONSUMER}`,
    `$JS.API.CONSUMER.INFO.${OBJECT_ALARMS_STREAM}.${OBJECT_ALARMS_CONSUMER}`,
    `$JS.ACK.${OBJECT_ALARMS_STREAM}.${OBJECT_ALARMS_CONSUMER}.>`,
  ];
}

/**
 * Provisioning: make each of the service's streams, or bring its configuration up to date
 * (stream info, create, update), the account info the clients ask first, and the one consumer
 * the service's roles share (the alarms'). No delete, no purge, no other consumer, no message of any stream.
 */
function provisionStreams(): string[] {
  const alarms = `${OBJECT_ALARMS_STREAM}.${OBJECT_ALARMS_CONSUMER}`;
  return [
    "$JS.API.INFO",
    ...serviceStreams.flatMap((stream) => [`INFO`, `CREATE`, `UPDATE`].map((api) => `$JS.API.STREAM.${api}.${stream}`)),
    `$JS.API.CONSUMER.CREATE.${alarms}`,
    `$JS.API.CONSUMER.CREATE.${alarms}.>`,
  ];
}

/** The operation subjects a role publishes (requests) and subscribes to (serves). */
export interface OperationGrants {
  readonly publish: readonly string[];
  readonly subscribe: readonly string[];
}

/**
 * The operation subjects of every role, derived from the contracts (`allOperations`, each
 * served by its API's role, `apiServices`): a new operation gets its subjects here by itself.
 */
export function operationGrants(prefix = ""): Record<NatsRole, OperationGrants> {
  const grants = Object.fromEntries(
    natsRoles.map((role) => [role, { publish: new Set<string>(), subscribe: new Set<string>() }]),
  ) as Record<NatsRole, { publish: Set<string>; subscribe: Set<string> }>;
  for (const op of allOperations) {
    const server = grants[servingRole(op)];
    const shared = subscriptionSubject(op, prefix);
    // Other services call every operation on its shared subject, as `nats:internal`.
    grants.internal.publish.add(shared);
    server.subscribe.add(shared);
    if (sendsPrincipal(op)) {
      // The HTTP caller's principal travels on copies only the gateway may publish.
      const gatewayOnly = subscriptionSubject(viaGateway(op), prefix);
      grants.gateway.publish.add(gatewayOnly);
      server.subscribe.add(gatewayOnly);
    } else {
      grants.gateway.publish.add(shared);
    }
    if (isOwned(op)) {
      // Owners serve their own subjects and pass requests that reached them to each other.
      const owners = ownerSubjects(op, prefix);
      server.subscribe.add(owners);
      server.publish.add(owners);
      // The gateway finds a name's owner from its lease and asks it directly (a record's
      // host is found by the hosts, which forward).
      if (op.placement.kind === "byName") grants.gateway.publish.add(owners);
    }
  }
  return Object.fromEntries(
    natsRoles.map((role) => [role, { publish: [...grants[role].publish], subscribe: [...grants[role].subscribe] }]),
  ) as unknown as Record<NatsRole, OperationGrants>;
}

/**
 * Least-privilege permissions of every role: the operation subjects (`operationGrants`), the
 * buckets each role reads or owns, its inbox and its service's discovery subjects.
 * `prefix` is the subject prefix of the operations.
 */
export function rolePermissions(prefix = ""): Record<NatsRole, Permissions> {
  const ops = operationGrants(prefix);
  const inbox = (role: NatsRole) => `${inboxPrefixOf(role)}.>`;
  return {
    gateway: {
      // Besides the operations, the reads it serves itself from storage, the cancels of the
      // held requests whose clients left, and the record of revoked API keys it writes.
      publish: {
        allow: [
          ...ops.gateway.publish,
          ...ACTOR_BUCKETS.flatMap(kvRead),
          heldCancelSubject(prefix),
          ...kvOwn(bucketNames.keyRevocations),
        ],
      },
      // The change feed of the records whose reads it keeps.
      subscribe: { allow: [...ops.gateway.subscribe, `${recordChangesSubject(prefix)}.>`, inbox("gateway")] },
    },
    // Each serving role answers its NATS micro service's `$SRV` PING, INFO and STATS (discovery).
    actors: {
      publish: {
        allow: [...ops.actors.publish, ...ACTOR_BUCKETS.flatMap(kvOwn), ...INDEXED_BUCKETS.flatMap(indexOwn)],
      },
      subscribe: {
        allow: [...ops.actors.subscribe, ...serviceControlSubjects(serviceNames.actors), inbox("actors")],
      },
      allow_responses: true,
    },
    microvms: {
      // Purge of `microvms` (its own stream only): the retention sweep removes an ended record's
      // delete marker for good. `images` needs none (a KV purge is a publish to the key).
      publish: {
        allow: [
          ...ops.microvms.publish,
          ...HOST_BUCKETS.flatMap(kvOwn),
          `$JS.API.STREAM.PURGE.KV_${bucketNames.microvms}`,
          ...objOwn(imageObjectBucket),
          ...objOwn(snapshotObjectBucket),
          ...logStreamOwn(),
          ...objectsOwn(),
          // The API keys revoked since the tokens it signs were issued.
          ...kvRead(bucketNames.keyRevocations),
          "$JS.API.INFO",
        ],
      },
      subscribe: {
        allow: [
          ...ops.microvms.subscribe,
          ...serviceControlSubjects(serviceNames.microvms),
          inbox("microvms"),
          // A read that waits for an instance's next line listens on its subject, until the
          // gateway says its client left.
          instanceLogSubjects,
          heldCancelSubject(prefix),
        ],
      },
      allow_responses: true,
    },
    internal: {
      // `$SRV.>`: discovery (`nats micro ls|info|stats`) of the services' instances. Jobs are
      // watched on the subject the server republishes them to, and replayed by direct gets:
      // no consumer, since a push consumer may name any deliver subject (permissions cannot
      // see it) and so make the server publish where this user may not.
      publish: { allow: [...ops.internal.publish, ...kvRead(bucketNames.jobs), `${SERVICE_API_PREFIX}.>`] },
      subscribe: { allow: [...ops.internal.subscribe, `${jobsCreatedSubject(prefix)}.>`, inbox("internal")] },
    },
    // Used once at start, by the process that starts the service, then closed (main.ts).
    provision: {
      publish: { allow: provisionStreams() },
      subscribe: { allow: [inbox("provision")] },
    },
  };
}

/** A user entry of the `authorization {}` block. */
export interface NkeyUser {
  readonly nkey: string;
  readonly permissions: Permissions;
}

/** The `authorization {}` block naming each role's public key with its permissions. */
export function authorizationConfig(
  credentials: Record<NatsRole, NatsCredentials>,
  prefix = "",
  extraUsers: readonly NkeyUser[] = [],
): string {
  const permissions = rolePermissions(prefix);
  const roles = natsRoles.map((role) => ({
    nkey: publicKeyOf(credentials[role].nkeySeed!),
    permissions: permissions[role],
  }));
  const users = [...roles, ...extraUsers];
  return `authorization: ${JSON.stringify({ users }, null, 2)}`;
}

/** Where `npm start` keeps the credentials of its private server. */
export const authDirOf = (dataDir: string) => join(dataDir, "nats-auth");

/**
 * The credentials a process uses as `role`, from its environment: `NATS_CREDS` (a `.creds`
 * file), `NATS_USER`/`NATS_PASSWORD`, `NATS_NKEY` (a seed file), else the role's generated
 * seed in `NATS_AUTH_DIR` (or `fallbackDir`). Undefined: connect without credentials.
 */
export async function credentialsFromEnv(
  env: NodeJS.ProcessEnv,
  role: NatsRole,
  fallbackDir?: string,
): Promise<NatsCredentials | undefined> {
  const inbox = env.NATS_INBOX_PREFIX ? { inboxPrefix: env.NATS_INBOX_PREFIX } : {};
  if (env.NATS_CREDS) return { creds: await readFile(env.NATS_CREDS, "utf8"), ...inbox };
  if (env.NATS_USER) return { user: env.NATS_USER, pass: env.NATS_PASSWORD ?? "", ...inbox };
  if (env.NATS_NKEY) return { nkeySeed: (await readFile(env.NATS_NKEY, "utf8")).trim(), ...inbox };
  const dir = env.NATS_AUTH_DIR || fallbackDir;
  return dir ? readNatsCredentials(dir, role) : undefined;
}

/** Who makes the streams at start: connect with `credentials` (undefined: without any). */
export interface Provisioner {
  readonly credentials: NatsCredentials | undefined;
}

/**
 * The provisioning credential of a process joining another NATS, from its environment:
 * `NATS_PROVISION_CREDS`, `NATS_PROVISION_USER`/`NATS_PROVISION_PASSWORD`, `NATS_PROVISION_NKEY`,
 * else the generated `provision` seed in `NATS_AUTH_DIR`. A NATS joined with no credential at
 * all takes anyone, so that connection provisions too. Undefined: this process opens the stores
 * as they are and changes no stream (the roles of compose.yaml, provisioned by a one-shot step).
 */
export async function provisionerFromEnv(env: NodeJS.ProcessEnv): Promise<Provisioner | undefined> {
  const inbox = { inboxPrefix: inboxPrefixOf("provision") };
  if (env.NATS_PROVISION_CREDS)
    return { credentials: { creds: await readFile(env.NATS_PROVISION_CREDS, "utf8"), ...inbox } };
  if (env.NATS_PROVISION_USER)
    return { credentials: { user: env.NATS_PROVISION_USER, pass: env.NATS_PROVISION_PASSWORD ?? "", ...inbox } };
  if (env.NATS_PROVISION_NKEY)
    return { credentials: { nkeySeed: (await readFile(env.NATS_PROVISION_NKEY, "utf8")).trim(), ...inbox } };
  if (env.NATS_AUTH_DIR) {
    const credentials = await readNatsCredentials(env.NATS_AUTH_DIR, "provision");
    return credentials ? { credentials } : undefined;
  }
  const anonymous = !env.NATS_CREDS && !env.NATS_USER && !env.NATS_NKEY;
  return anonymous ? { credentials: undefined } : undefined;
}

/** Client credentials and where they came from, for a message when the server refuses them. */
export interface ClientCredentials {
  readonly credentials: NatsCredentials | undefined;
  /** "NATS_CREDS", "the internal user of DATA_DIR=/x", "none: …" and so on. */
  readonly source: string;
}

/**
 * Credentials of a client tool (taskctl --nats, watch-jobs, other services) joining `servers`:
 * from the environment, else, when `servers` is the NATS of a local `npm start` (its
 * DATA_DIR/nats-url; DATA_DIR default `.data`, relative to the working directory as the service
 * takes it), that server's `internal` user.
 */
export async function findClientCredentials(
  servers: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<ClientCredentials> {
  const fromEnv = await credentialsFromEnv(env, "internal");
  if (fromEnv) {
    const source = ["NATS_CREDS", "NATS_USER", "NATS_NKEY"].find((name) => env[name]);
    return { credentials: fromEnv, source: source ?? `NATS_AUTH_DIR=${env.NATS_AUTH_DIR} (its internal.nk)` };
  }
  const dataDir = resolve(env.DATA_DIR || ".data");
  const local = (await readFile(join(dataDir, "nats-url"), "utf8").catch(() => "")).trim();
  if (!local)
    return { credentials: undefined, source: `none (DATA_DIR=${dataDir} has no nats-url: no npm start there)` };
  if (!sameServers(servers, local))
    return { credentials: undefined, source: `none (the NATS of DATA_DIR=${dataDir} is ${local}, not this one)` };
  const credentials = await readNatsCredentials(authDirOf(dataDir), "internal");
  return { credentials, source: `the internal user of DATA_DIR=${dataDir}` };
}

/** `findClientCredentials` without the source. */
export async function clientCredentials(
  servers: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<NatsCredentials | undefined> {
  return (await findClientCredentials(servers, env)).credentials;
}

/** True when two comma-separated server lists name the same servers (scheme optional, localhost as 127.0.0.1). */
export function sameServers(a: string, b: string): boolean {
  const norm = (list: string) =>
    list
      .split(",")
      .map((url) =>
        url
          .trim()
          .replace(/^nats:\/\//, "")
          .replace(/\/$/, "")
          .replace(/^localhost(?=:|$)/, "127.0.0.1"),
      )
      .filter(Boolean)
      .sort()
      .join(",");
  return norm(a) === norm(b);
}

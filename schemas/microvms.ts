// MicroVM instance operation contracts: served over NATS (`microvms.<op>`) and as REST
// under `/2025-09-09/microvms` on the microVM API.
import { Type, type Static } from "@sinclair/typebox";
import { Count } from "./counts.ts";
import {
  ImageNotFound,
  InvalidStateTransition,
  MicrovmLimitExceeded,
  MicrovmNotFound,
  MicrovmQuotaExceeded,
  MicrovmStartTimeout,
  SnapshotQuotaExceeded,
  type ErrorDef,
} from "./errors.ts";
import { imageApi } from "./images.ts";
import { LogPage, LogQuery, logWaitMs } from "./logs.ts";
import { objectApi } from "./objects.ts";
import { ownedByHost, stateless } from "./placement.ts";
import type { Operation } from "./types.ts";

/** Instance states (contract), the one list: the lifecycle machine's top-level states must match it. */
export const MICROVM_STATES = [
  "PENDING",
  "RUNNING",
  "SUSPENDING",
  "SUSPENDED",
  "TERMINATING",
  "TERMINATED",
  "FAILED",
] as const;

export const MicrovmState = Type.Union(MICROVM_STATES.map((state) => Type.Literal(state)));
/** An instance's state as GetMicrovm reports it. */
export type MicrovmState = Static<typeof MicrovmState>;

/** When an idle instance is suspended, and a suspended one terminated. */
export const IdlePolicy = Type.Object(
  {
    maxIdleDurationSeconds: Type.Integer({ minimum: 1, maximum: 86_400 }),
    suspendedDurationSeconds: Type.Integer({ minimum: 1, maximum: 604_800 }),
    autoResumeEnabled: Type.Boolean(),
  },
  { additionalProperties: false },
);
export type IdlePolicy = Static<typeof IdlePolicy>;

/** RunMicrovm's idle policy when the caller gives none, or leaves fields out (taskctl's defaults). */
export const DEFAULT_IDLE_POLICY: IdlePolicy = {
  maxIdleDurationSeconds: 300,
  suspendedDurationSeconds: 600,
  autoResumeEnabled: true,
};

/** RunMicrovm's `idlePolicy`: every field optional, filled from DEFAULT_IDLE_POLICY. */
const IdlePolicyInput = Type.Object(
  {
    maxIdleDurationSeconds: Type.Optional(
      Type.Integer({
        ...IdlePolicy.properties.maxIdleDurationSeconds,
        default: DEFAULT_IDLE_POLICY.maxIdleDurationSeconds,
      }),
    ),
    suspendedDurationSeconds: Type.Optional(
      Type.Integer({
        ...IdlePolicy.properties.suspendedDurationSeconds,
        default: DEFAULT_IDLE_POLICY.suspendedDurationSeconds,
      }),
    ),
    autoResumeEnabled: Type.Optional(Type.Boolean({ default: DEFAULT_IDLE_POLICY.autoResumeEnabled })),
  },
  { additionalProperties: false, default: {} },
);

/** The longest `waitSeconds` of RunMicrovm, and its default with `wait=running`. */
export const MAX_RUN_WAIT_SECONDS = 60;
export const DEFAULT_RUN_WAIT_SECONDS = 30;

/** An instance as GetMicrovm answers it. */
export const Microvm = Type.Object({
  microvmId: Type.String(),
  imageIdentifier: Type.String(),
  imageDigest: Type.Optional(Type.String({ description: "sha256:<hex> of the module the instance runs" })),
  state: MicrovmState,
  stateReason: Type.Optional(Type.String()),
  endpoint: Type.String({ description: "host:port of the instance proxy" }),
  idlePolicy: IdlePolicy,
  startedAt: Type.String({ format: "date-time" }),
});

/**
 * A port scope of an auth token: exactly one of `port`, `range`, `allPorts`. The branches
 * bound their keys with `maxProperties` rather than `additionalProperties: false`: Ajv's
 * `removeAdditional` would strip `range`/`allPorts` while trying the first branch of the union.
 */
export const AllowedPort = Type.Union([
  Type.Object({ port: Type.Integer({ minimum: 1, maximum: 65_535 }) }, { maxProperties: 1 }),
  Type.Object(
    {
      range: Type.Object(
        {
          startPort: Type.Integer({ minimum: 1, maximum: 65_535 }),
          endPort: Type.Integer({ minimum: 1, maximum: 65_535 }),
        },
        { additionalProperties: false },
      ),
    },
    { maxProperties: 1 },
  ),
  Type.Object({ allPorts: Type.Object({}, { additionalProperties: false }) }, { maxProperties: 1 }),
]);
export type AllowedPort = Static<typeof AllowedPort>;

const InstanceParams = Type.Object(
  { microvmIdentifier: Type.String({ minLength: 1, maxLength: 256 }) },
  { additionalProperties: false },
);

const InstanceState = Type.Object({ microvmId: Type.String(), state: MicrovmState });

const base = "/2025-09-09/microvms";

/** The seconds a RunMicrovm with `wait: "running"` waits. */
export function runWaitSeconds(input: { waitSeconds?: unknown }): number {
  return input.waitSeconds === undefined ? DEFAULT_RUN_WAIT_SECONDS : Number(input.waitSeconds);
}

export const runMicrovm = {
  name: "runMicrovm",
  api: "microvm",
  http: { method: "POST", path: base },
  subject: "microvms.run",
  placement: stateless,
  payload: Type.Object(
    {
      imageIdentifier: Type.Optional(
        Type.String({
          minLength: 1,
          maxLength: 140,
          default: "sandbox",
          description: "`name` (its latest digest) or `name@sha256:<hex>`",
        }),
      ),
      idlePolicy: Type.Optional(IdlePolicyInput),
    },
    { additionalProperties: false },
  ),
  query: Type.Object({
    wait: Type.Optional(
      Type.Literal("running", {
        description:
          "answer once the instance is RUNNING (its runtime answers), not at once with PENDING; over NATS a field " +
          "of the request",
      }),
    ),
    // A number over NATS, digits in an HTTP query string.
    waitSeconds: Type.Optional(
      Count(
        MAX_RUN_WAIT_SECONDS,
        `with wait=running: how long to wait, 1-${MAX_RUN_WAIT_SECONDS} s (default ${DEFAULT_RUN_WAIT_SECONDS}); ` +
          `then 504 MicrovmStartTimeout`,
      ),
    ),
  }),
  success: Type.Object({ microvmId: Type.String(), endpoint: Type.String(), state: MicrovmState }),
  errors: [ImageNotFound, MicrovmLimitExceeded, MicrovmQuotaExceeded, MicrovmStartTimeout, InvalidStateTransition],
  waitMsOf: (input) => (input.wait === "running" ? runWaitSeconds(input) * 1000 : undefined),
  /**
   * An `Idempotency-Key` fixes the microvmId (derived from the key and the caller's principal,
   * so two principals' equal keys name two instances): a retried run answers the same instance.
   */
  idempotent: true,
  summary: "Launch an instance of an image",
} as const satisfies Operation;

export const getMicrovm = {
  name: "getMicrovm",
  api: "microvm",
  http: { method: "GET", path: `${base}/:microvmIdentifier` },
  subject: "microvms.get",
  placement: stateless,
  params: InstanceParams,
  success: Microvm,
  errors: [MicrovmNotFound],
  summary: "Describe an instance",
} as const satisfies Operation;

export const listMicrovms = {
  name: "listMicrovms",
  api: "microvm",
  http: { method: "GET", path: base },
  subject: "microvms.list",
  placement: stateless,
  success: Type.Object({ items: Type.Array(Microvm) }),
  errors: [],
  summary: "List instances",
} as const satisfies Operation;

export const getMicrovmLogs = {
  name: "getMicrovmLogs",
  api: "microvm",
  http: { method: "GET", path: `${base}/:microvmIdentifier/logs` },
  subject: "microvms.logs",
  placement: stateless,
  params: InstanceParams,
  query: LogQuery,
  success: LogPage,
  errors: [MicrovmNotFound],
  waitMsOf: logWaitMs,
  follow: { items: "items", waitSeconds: 20 },
  summary: "Read an instance's output lines (stdout and stderr): the latest, or those after a cursor",
} as const satisfies Operation;

export const createAuthToken = {
  name: "createAuthToken",
  api: "microvm",
  http: { method: "POST", path: `${base}/:microvmIdentifier/auth-token` },
  subject: "microvms.token",
  placement: ownedByHost("microvmIdentifier"),
  params: InstanceParams,
  payload: Type.Object(
    {
      expirationInMinutes: Type.Integer({ minimum: 1, maximum: 60 }),
      allowedPorts: Type.Array(AllowedPort, { minItems: 1, maxItems: 64 }),
    },
    { additionalProperties: false },
  ),
  success: Type.Object({
    authToken: Type.Object({ "X-aws-proxy-auth": Type.String() }),
  }),
  errors: [MicrovmNotFound, InvalidStateTransition],
  summary: "Mint a token for the instance proxy, scoped to ports and an expiry",
} as const satisfies Operation;

/**
 * Deadline of a suspend's checkpoint (its snapshot stored) and of a resume's restore: past it
 * the instance is FAILED. SuspendMicrovm's answer waits at most this long for its suspend to
 * settle; ResumeMicrovm's twice as long (a suspend under way first, then the restore).
 */
export const SNAPSHOT_STEP_SECONDS = 30;
/** Longest SuspendMicrovm waits for SUSPENDED (or FAILED) before it answers the state it is in. */
export const SUSPEND_WAIT_MS = SNAPSHOT_STEP_SECONDS * 1000;
/** Longest ResumeMicrovm waits for RUNNING (or FAILED) before it answers the state it is in. */
export const RESUME_WAIT_MS = 2 * SNAPSHOT_STEP_SECONDS * 1000;

const transition = <const Refusals extends readonly ErrorDef[] = []>(
  name: string,
  verb: string,
  method: "POST" | "DELETE",
  path: string,
  subject: string,
  waitMs?: number,
  refusals?: Refusals,
) =>
  ({
    name,
    api: "microvm",
    http: { method, path },
    subject,
    placement: ownedByHost("microvmIdentifier"),
    params: InstanceParams,
    success: InstanceState,
    errors: [MicrovmNotFound, InvalidStateTransition, ...(refusals ?? ([] as unknown as Refusals))],
    summary: `${verb} an instance`,
    // The answer waits for the transition to settle: the caller's time for it grows as much.
    ...(waitMs === undefined ? {} : { waitMsOf: () => waitMs }),
  }) as const satisfies Operation;

export const suspendMicrovm = transition(
  "suspendMicrovm",
  "Suspend",
  "POST",
  `${base}/:microvmIdentifier/suspend`,
  "microvms.suspend",
  SUSPEND_WAIT_MS,
  [SnapshotQuotaExceeded],
);
export const resumeMicrovm = transition(
  "resumeMicrovm",
  "Resume",
  "POST",
  `${base}/:microvmIdentifier/resume`,
  "microvms.resume",
  RESUME_WAIT_MS,
);
export const terminateMicrovm = transition(
  "terminateMicrovm",
  "Terminate",
  "DELETE",
  `${base}/:microvmIdentifier`,
  "microvms.terminate",
);

export const microvmApi = {
  runMicrovm,
  listMicrovms,
  getMicrovm,
  getMicrovmLogs,
  createAuthToken,
  suspendMicrovm,
  resumeMicrovm,
  terminateMicrovm,
  ...imageApi,
  ...objectApi,
} as const;

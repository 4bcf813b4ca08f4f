// The NATS permissions are derived from the contracts: for every declared operation, on a real
// nats-server with the generated config, exactly the roles that need each of its subjects get
// it. The expected roles are written here from the design (which role serves each API, who
// calls it), not read from the code under test, so a new operation is checked as it lands.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { authOptions, natsRoles, type NatsRole } from "../platform/index.ts";
import * as schemas from "../schemas/index.ts";
import {
  allOperations,
  isOwned,
  onOwner,
  requestSubject,
  subjectFields,
  subscriptionSubject,
  viaGateway,
  type ApiName,
  type Operation,
} from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats, type TestRole } from "./helpers/nats.ts";

const defer = lifo(after);

/**
 * The design: the role serving each API, and the APIs whose gateway requests carry a principal
 * (every one: each API's data belongs to its principal).
 */
const servedBy: Record<ApiName, NatsRole> = { task: "actors", job: "actors", microvm: "microvms" };
const withPrincipal = new Set<ApiName>(["task", "job", "microvm"]);

interface SubjectCase {
  /** What the subject is, for messages. */
  kind: "shared" | "gateway copy" | "owner's own";
  /** A concrete request subject. */
  subject: string;
  /** The subject a server subscribes to. */
  subscription: string;
  publishers: ReadonlySet<NatsRole>;
  subscribers: ReadonlySet<NatsRole>;
}

/** The subjects of `op` and, for each, the roles that need to publish or subscribe to it. */
function casesOf(op: Operation): SubjectCase[] {
  const input = Object.fromEntries(subjectFields(op).map((field) => [field, "x"]));
  const server = servedBy[op.api];
  const principal = withPrincipal.has(op.api);
  const cases: SubjectCase[] = [
    {
      kind: "shared",
      subject: requestSubject(op, input),
      subscription: subscriptionSubject(op),
      // Other services call it as nats:internal; the gateway too, unless it sends a principal.
      publishers: new Set<NatsRole>(principal ? ["internal"] : ["internal", "gateway"]),
      subscribers: new Set([server]),
    },
  ];
  if (principal) {
    const copy = viaGateway(op);
    cases.push({
      kind: "gateway copy",
      subject: requestSubject(copy, input),
      subscription: subscriptionSubject(copy),
      publishers: new Set(["gateway"]),
      subscribers: new Set([server]),
    });
  }
  if (isOwned(op)) {
    const own = onOwner(op, "owner-1");
    cases.push({
      kind: "owner's own",
      subject: requestSubject(own, input),
      subscription: subscriptionSubject(own),
      // Owners pass requests on to each other; the gateway asks a name's owner (from its lease).
      publishers: new Set<NatsRole>(op.placement.kind === "byName" ? [server, "gateway"] : [server]),
      subscribers: new Set([server]),
    });
  }
  return cases;
}

let nats: TestNats;
const conns = new Map<TestRole, NatsConnection>();
/** Permission violations seen per connection, and who waits for which. */
const violations = new Map<NatsConnection, { seen: Set<string>; waiting: Map<string, () => void> }>();

before(async () => {
  nats = await testNats(defer, { private: true });
  for (const role of [...natsRoles, "admin"] as const) {
    const { servers, credentials } = nats.login(role);
    const nc = await connect({ servers, name: `test:${role}`, maxReconnectAttempts: 0, ...authOptions(credentials) });
    defer(() => nc.close());
    conns.set(role, nc);
    const record = { seen: new Set<string>(), waiting: new Map<string, () => void>() };
    violations.set(nc, record);
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type !== "error") continue;
        const err = status.error as Error & { operation?: string; subject?: string };
        if (err.name !== "PermissionViolationError") continue;
        const key = `${err.operation}\0${err.subject}`;
        record.seen.add(key);
        record.waiting.get(key)?.();
      }
    })();
  }
});

const conn = (role: TestRole) => conns.get(role)!;

/** Resolves when the server refused `operation` on `subject` to `nc`. */
function refused(nc: NatsConnection, operation: "publish" | "subscription", subject: string): Promise<"refused"> {
  const record = violations.get(nc)!;
  const key = `${operation}\0${subject}`;
  if (record.seen.has(key)) return Promise.resolve("refused");
  return new Promise((resolve) => record.waiting.set(key, () => resolve("refused")));
}

/** Resolves after `ms` (a bound on an answer that a working server gives in milliseconds). */
const timeout = (ms: number) =>
  new Promise<"timeout">((resolve) => {
    const timer = setTimeout(() => resolve("timeout"), ms);
    defer(() => clearTimeout(timer));
  });

/** Whether `role` may publish `subject`: the admin's subscription receives it, or the server refuses it. */
async function mayPublish(role: NatsRole, subject: string): Promise<boolean> {
  const admin = conn("admin");
  const nc = conn(role);
  let delivered!: () => void;
  const received = new Promise<"received">((resolve) => (delivered = () => resolve("received")));
  const sub = admin.subscribe(subject, { callback: () => delivered() });
  await admin.flush();
  nc.publish(subject, "x");
  const outcome = await Promise.race([received, refused(nc, "publish", subject), timeout(5_000)]);
  sub.unsubscribe();
  assert.notEqual(outcome, "timeout", `${role} publishing ${subject}: neither delivered nor refused`);
  return outcome === "received";
}

/** Whether `role` may subscribe to `subscription`: it receives the admin's message on `subject`, or is refused. */
async function maySubscribe(role: NatsRole, subscription: string, subject: string): Promise<boolean> {
  const admin = conn("admin");
  const nc = conn(role);
  let delivered!: () => void;
  const received = new Promise<"received">((resolve) => (delivered = () => resolve("received")));
  const sub = nc.subscribe(subscription, { callback: (err) => void (err || delivered()) });
  const denied = refused(nc, "subscription", subscription);
  await nc.flush();
  admin.publish(subject, "x");
  const outcome = await Promise.race([received, denied, timeout(5_000)]);
  sub.unsubscribe();
  assert.notEqual(outcome, "timeout", `${role} subscribing ${subscription}: neither received nor refused`);
  return outcome === "received";
}

describe("nats permissions - derived from the contracts", () => {
  it("nats permissions - every operation the contracts export is one of allOperations", () => {
    const declared = (Object.values(schemas) as unknown[]).filter(
      (value): value is Operation =>
        typeof value === "object" && value !== null && "subject" in value && "placement" in value,
    );
    assert.ok(declared.length >= 17, `found ${declared.length} operations`);
    for (const op of declared) assert.ok(allOperations.includes(op), `${op.name} is in no served API`);
    assert.equal(new Set(allOperations.map((op) => op.name)).size, allOperations.length);
  });

  for (const op of allOperations) {
    it(`nats permissions - ${op.name}: exactly the roles that need its subjects get them`, async () => {
      for (const c of casesOf(op)) {
        for (const role of natsRoles) {
          assert.equal(
            await mayPublish(role, c.subject),
            c.publishers.has(role),
            `${role} publishing the ${c.kind} subject ${c.subject}`,
          );
          assert.equal(
            await maySubscribe(role, c.subscription, c.subject),
            c.subscribers.has(role),
            `${role} subscribing to the ${c.kind} subject ${c.subscription}`,
          );
        }
      }
    });
  }
});

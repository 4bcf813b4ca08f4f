// Objects on a real NATS for tests: the streams made by the provisioning user, a connection as
// the microVM host role, a lease in the objects bucket standing in for placement's activation
// (claim, renew, take over), and NATS stopped or killed and started again on its store.
import assert from "node:assert/strict";
import { ApiError } from "../../schemas/index.ts";
import {
  CONFLICT,
  connectNats,
  OBJECTS_BUCKET,
  provisionObjectStreams,
  startNatsServer,
  versionedStore,
  type NatsHandle,
  type VersionedStore,
} from "../../platform/index.ts";
import {
  DEFAULT_CALL_TIMEOUT_MS,
  DEFAULT_START_TIMEOUT_MS,
  objectKey,
  type ActivationFence,
  type ObjectOperationDeps,
  type ObjectRef,
} from "../../vm-runtime/objects/index.ts";
import type { Defer } from "./defer.ts";
import { testNats, type TestNats, type TestRole } from "./nats.ts";

export interface ObjectsNats {
  nats: TestNats;
  /** A connection as `role` (the microVM host by default), closed at the end. */
  as(role?: TestRole): Promise<NatsHandle>;
  /** Stops NATS (SIGKILL when `kill`) and starts it again on the same port and store. */
  restart(kill?: boolean): Promise<void>;
}

export async function objectsNats(defer: Defer): Promise<ObjectsNats> {
  const nats = await testNats(defer, { private: true });
  let server = nats.server!;
  const handles = new Set<NatsHandle>();
  const as = async (role: TestRole = "microvms") => {
    const handle = await connectNats({ ...nats.login(role), name: `test:${role}` });
    handles.add(handle);
    defer(() => handle.close());
    return handle;
  };
  const provision = await as("provision");
  await provisionObjectStreams(provision.nc);
  await provision.close();
  handles.delete(provision);
  return {
    nats,
    as,
    async restart(kill = false) {
      if (kill) {
        const exited = new Promise((resolve) => server.process.once("exit", resolve));
        server.process.kill("SIGKILL");
        await exited;
      } else {
        await server.stop();
      }
      server = await startNatsServer({
        storeDir: nats.storeDir!,
        port: server.port,
        authorization: nats.authorization,
      });
      defer(() => server.stop());
      // The connections made before reconnect within their reconnect wait.
      for (const handle of handles) await reconnected(() => handle.connected() || handle.nc.isClosed());
    },
  };
}

/** An activation of one object as placement would hold it: its lease key and revision. */
export interface TestLease {
  readonly fence: ActivationFence;
  readonly revision: number;
  /** Claims the lease whoever held it (a takeover), as this activation. */
  claim(): Promise<void>;
  /** Renews the lease by itself (a heartbeat), as placement's timer does. */
  renew(): Promise<void>;
}

export function testLease(handle: NatsHandle, object: ObjectRef, owner: string): TestLease {
  const leases: VersionedStore = versionedStore(handle.requester, OBJECTS_BUCKET);
  const key = objectKey(object);
  let revision = 0;
  const renew = async () => {
    const written = await leases.put(key, owner, revision);
    if (written === CONFLICT) throw new Error(`${owner} lost the lease of ${key}`);
    revision = written;
  };
  return {
    fence: { token: () => ({ leaseKey: key, revision }), renew },
    get revision() {
      return revision;
    },
    async claim() {
      const written = await leases.put(key, owner, (await leases.get(key)).revision);
      if (written === CONFLICT) throw new Error(`${owner} could not claim ${key}`);
      revision = written;
    },
    renew,
  };
}

/** Resolves once `condition` holds (checked every 20 ms, for at most 15 s). */
async function reconnected(condition: () => boolean): Promise<void> {
  for (const end = Date.now() + 15_000; !condition(); await new Promise((r) => setTimeout(r, 20)))
    if (Date.now() > end) throw new Error("the connection did not come back within 15 s");
}

/**
 * The longest an object's state may take to settle in these tests: a start's deadline and a
 * call's timeout, and 5 s of margin. A wait past it waits for nothing: it fails instead of hanging.
 */
export const OBJECT_SETTLE_MS = DEFAULT_START_TIMEOUT_MS + DEFAULT_CALL_TIMEOUT_MS + 5_000;

/** Resolves once `condition` holds, checked every `everyMs`; fails after `OBJECT_SETTLE_MS`. */
export async function until(condition: () => boolean | Promise<boolean>, everyMs = 100): Promise<void> {
  const deadline = performance.now() + OBJECT_SETTLE_MS;
  while (!(await condition())) {
    if (performance.now() > deadline) throw new Error(`the condition did not hold within ${OBJECT_SETTLE_MS} ms`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** The ApiError `fn` rejects with; fails when it resolves or rejects with anything else. */
export async function rejected(fn: () => Promise<unknown>): Promise<ApiError> {
  const err = await fn().then(
    () => assert.fail("expected a rejection"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApiError, `an ApiError, got ${String(err)}`);
  return err;
}

/** The object handlers' log parts for tests that read no logs: none stored, no long poll held. */
export const withoutLogs: Pick<ObjectOperationDeps, "logs" | "held"> = {
  logs: {
    read: async () => ({ items: [], cursor: "0" }),
    has: async () => false,
  },
  held: { hold: (_headers, work) => work() },
};

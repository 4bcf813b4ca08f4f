// The microVM operations end to end, over NATS and over HTTP: run → RUNNING → token → RPC
// through the proxy → suspend (process stopped) → resume → terminate (process gone); list;
// declared errors (404, 409, 429) and decode failures (400) as typed `_tag`s.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { ClientError } from "../client/index.ts";
import { MicrovmStore } from "../vm-runtime/service/index.ts";
import { connectMicrovm, type SandboxShape } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  policy,
  isGone,
  isSuspended,
  isSuspendedOrSaved,
  startMicrovmService,
  waitForState,
  type MicrovmClient,
  type MicrovmService,
} from "./helpers/microvm.ts";

const defer = lifo(after);
let svc: MicrovmService;
let store: MicrovmStore;

before(async () => {
  svc = await startMicrovmService(defer, { maxInstances: 6, quotaPerPrincipal: 50 }); // the host limit, not the quota
  store = new MicrovmStore(svc.kv, svc.handle.nc);
});
after(assertNoInstanceLeft);

async function rejectsWith(call: Promise<unknown>, tag: string, status: number): Promise<Record<string, unknown>> {
  const err = await call.then(
    () => assert.fail(`expected ${tag}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ClientError, `a ClientError, got ${String(err)}`);
  assert.equal(err._tag, tag);
  assert.equal(err.status, status);
  return err.error as Record<string, unknown>;
}

async function postRaw(path: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function natsRaw(op: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const reply = await svc.handle.nc.request(`microvms.${op}`, JSON.stringify(body), { timeout: 5_000 });
  return { status: Number(reply.headers?.get("Nats-Service-Error-Code") ?? 200), body: reply.json() };
}

async function pidOf(microvmId: string): Promise<number> {
  const pid = (await store.read(microvmId))?.record.handle?.pid;
  assert.ok(pid, "the record names the instance's pid");
  return pid;
}

for (const transport of ["nats", "http"] as const) {
  const client = (): MicrovmClient => (transport === "nats" ? svc.overNats : svc.overHttp);

  describe(`microvm api over ${transport}`, () => {
    it(`microvm api (${transport}) - run, call, suspend, resume, call, terminate`, async () => {
      const api = client();
      const run = await api.runMicrovm({ idlePolicy: policy() });
      assert.equal(run.state, "PENDING");
      assert.match(run.endpoint, /^127\.0\.0\.1:\d+$/);
      const running = await waitForState(api, run.microvmId, ["RUNNING"]);
      assert.equal(running.imageIdentifier, "sandbox");
      assert.equal(running.endpoint, run.endpoint);
      assert.deepEqual(running.idlePolicy, policy());

      const { authToken } = await api.createAuthToken({
        microvmIdentifier: run.microvmId,
        expirationInMinutes: 5,
        allowedPorts: [{ port: 8080 }],
      });
      const stub = connectMicrovm<SandboxShape>({ endpoint: run.endpoint, authToken });
      assert.equal(await stub.hello("world"), "hello, world!");
      const pid = await pidOf(run.microvmId);
      for (const allowedPorts of [[{ range: { startPort: 8000, endPort: 8100 } }], [{ allPorts: {} }]]) {
        const scoped = await api.createAuthToken({
          microvmIdentifier: run.microvmId,
          expirationInMinutes: 1,
          allowedPorts,
        });
        assert.equal(
          await connectMicrovm<SandboxShape>({ endpoint: run.endpoint, authToken: scoped.authToken }).hello("scoped"),
          "hello, scoped!",
        );
      }
      const backwards =
        transport === "http"
          ? await postRaw(`/${run.microvmId}/auth-token`, {
              expirationInMinutes: 1,
              allowedPorts: [{ range: { startPort: 9, endPort: 1 } }],
            })
          : await natsRaw("token", {
              microvmIdentifier: run.microvmId,
              expirationInMinutes: 1,
              allowedPorts: [{ range: { startPort: 9, endPort: 1 } }],
            });
      assert.deepEqual([backwards.status, backwards.body._tag], [400, "HttpApiDecodeError"]);

      assert.deepEqual(await api.suspendMicrovm({ microvmIdentifier: run.microvmId }), {
        microvmId: run.microvmId,
        state: "SUSPENDED",
      });
      assert.ok(
        isSuspendedOrSaved(pid, (await store.read(run.microvmId))?.record),
        "a suspended instance is a stopped process, or none once its snapshot is stored",
      );
      assert.equal((await api.getMicrovm({ microvmIdentifier: run.microvmId })).state, "SUSPENDED");

      assert.deepEqual(await api.resumeMicrovm({ microvmIdentifier: run.microvmId }), {
        microvmId: run.microvmId,
        state: "RUNNING",
      });
      assert.ok(!isSuspended(pid));
      assert.equal(await stub.hello("again"), "hello, again!");

      assert.deepEqual(await api.terminateMicrovm({ microvmIdentifier: run.microvmId }), {
        microvmId: run.microvmId,
        state: "TERMINATED",
      });
      assert.ok(isGone(pid), "the instance process is gone");
      const ended = await api.getMicrovm({ microvmIdentifier: run.microvmId });
      assert.equal(ended.state, "TERMINATED");
      assert.equal(ended.stateReason, "TerminateRequested");
    });

    it(`microvm api (${transport}) - list has every instance with its contract fields`, async () => {
      const api = client();
      const a = await api.runMicrovm({ idlePolicy: policy() });
      const b = await api.runMicrovm({ imageIdentifier: "sandbox", idlePolicy: policy({ autoResumeEnabled: false }) });
      const { items } = await api.listMicrovms({});
      const ids = items.map((item) => item.microvmId);
      assert.ok(ids.includes(a.microvmId) && ids.includes(b.microvmId));
      const listed = items.find((item) => item.microvmId === b.microvmId)!;
      assert.deepEqual(Object.keys(listed).sort(), [
        "endpoint",
        "idlePolicy",
        "imageDigest",
        "imageIdentifier",
        "microvmId",
        "startedAt",
        "state",
      ]);
      assert.equal(listed.idlePolicy.autoResumeEnabled, false);
      await Promise.all([a, b].map((vm) => api.terminateMicrovm({ microvmIdentifier: vm.microvmId })));
    });

    it(`microvm api (${transport}) - unknown image and unknown instance are 404s`, async () => {
      const api = client();
      const image = await rejectsWith(
        api.runMicrovm({ imageIdentifier: "nope", idlePolicy: policy() }),
        "ImageNotFound",
        404,
      );
      assert.equal(image.imageIdentifier, "nope");
      // The test-only images exist on disk but are never served.
      for (const testOnly of ["probe", "hog", "hostile"]) {
        await rejectsWith(api.runMicrovm({ imageIdentifier: testOnly, idlePolicy: policy() }), "ImageNotFound", 404);
      }
      for (const id of ["missing", "a.b", "*", "%2F", "ü"]) {
        const body = await rejectsWith(api.getMicrovm({ microvmIdentifier: id }), "MicrovmNotFound", 404);
        assert.equal(body.microvmIdentifier, id);
      }
      await rejectsWith(api.suspendMicrovm({ microvmIdentifier: "missing" }), "MicrovmNotFound", 404);
      await rejectsWith(api.terminateMicrovm({ microvmIdentifier: "missing" }), "MicrovmNotFound", 404);
      await rejectsWith(
        api.createAuthToken({ microvmIdentifier: "missing", expirationInMinutes: 1, allowedPorts: [{ allPorts: {} }] }),
        "MicrovmNotFound",
        404,
      );
    });

    it(`microvm api (${transport}) - refused transitions are 409 InvalidStateTransition`, async () => {
      const api = client();
      const { microvmId } = await api.runMicrovm({ idlePolicy: policy() });
      await waitForState(api, microvmId, ["RUNNING"]);
      const resumed = await rejectsWith(
        api.resumeMicrovm({ microvmIdentifier: microvmId }),
        "InvalidStateTransition",
        409,
      );
      assert.deepEqual([resumed.microvmId, resumed.state], [microvmId, "RUNNING"]);
      await api.suspendMicrovm({ microvmIdentifier: microvmId });
      await rejectsWith(api.suspendMicrovm({ microvmIdentifier: microvmId }), "InvalidStateTransition", 409);

      assert.equal((await api.terminateMicrovm({ microvmIdentifier: microvmId })).state, "TERMINATED");
      assert.equal(
        (await api.terminateMicrovm({ microvmIdentifier: microvmId })).state,
        "TERMINATED",
        "terminate is idempotent",
      );
      await rejectsWith(api.resumeMicrovm({ microvmIdentifier: microvmId }), "InvalidStateTransition", 409);
      await rejectsWith(api.suspendMicrovm({ microvmIdentifier: microvmId }), "InvalidStateTransition", 409);
      const token = await rejectsWith(
        api.createAuthToken({ microvmIdentifier: microvmId, expirationInMinutes: 1, allowedPorts: [{ port: 8080 }] }),
        "InvalidStateTransition",
        409,
      );
      assert.equal(token.state, "TERMINATED");
    });

    it(`microvm api (${transport}) - invalid input is a 400 HttpApiDecodeError from the service`, async () => {
      const cases: [string, string, unknown][] = [
        [
          "run",
          "",
          { idlePolicy: { maxIdleDurationSeconds: 0, suspendedDurationSeconds: 1, autoResumeEnabled: true } },
        ],
        // (`{}` is a valid run: idlePolicy is optional, test/microvm-run-wait.test.ts)
        ["run", "", { idlePolicy: "often" }],
        ["run", "", { idlePolicy: { autoResumeEnabled: "yes" } }],
        ["token", "/x/auth-token", { expirationInMinutes: 61, allowedPorts: [{ port: 8080 }] }],
        ["token", "/x/auth-token", { expirationInMinutes: 5, allowedPorts: [] }],
      ];
      for (const [op, path, body] of cases) {
        const answer =
          transport === "http"
            ? await postRaw(path, body)
            : await natsRaw(op, path ? { ...(body as object), microvmIdentifier: "x" } : body);
        assert.equal(answer.status, 400, `${op} ${JSON.stringify(body)}`);
        assert.equal(answer.body._tag, "HttpApiDecodeError");
      }
    });
  });
}

describe("microvm api - limits and idempotency", () => {
  it("microvm api - a retried run with the same Idempotency-Key answers the same instance", async () => {
    const key = crypto.randomUUID();
    const first = await svc.overNats.runMicrovm({ idlePolicy: policy() }, { idempotencyKey: key });
    const again = await svc.overNats.runMicrovm({ idlePolicy: policy() }, { idempotencyKey: key });
    assert.equal(again.microvmId, first.microvmId);
    assert.equal(again.endpoint, first.endpoint);
    await rejectsWith(
      svc.overNats.runMicrovm({ idlePolicy: policy({ autoResumeEnabled: false }) }, { idempotencyKey: key }),
      "IdempotencyKeyReused",
      409,
    );
    const ours = (await svc.overNats.listMicrovms({})).items.filter((item) => item.microvmId === first.microvmId);
    assert.equal(ours.length, 1);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: first.microvmId });
  });

  it("microvm api - past the live-instance limit RunMicrovm is a 429 MicrovmLimitExceeded", async () => {
    const live = await Promise.all(Array.from({ length: 6 }, () => svc.overNats.runMicrovm({ idlePolicy: policy() })));
    const body = await rejectsWith(svc.overHttp.runMicrovm({ idlePolicy: policy() }), "MicrovmLimitExceeded", 429);
    assert.equal(body.limit, 6);
    await svc.overNats.terminateMicrovm({ microvmIdentifier: live[0]!.microvmId });
    // It counts until TERMINATED (a terminate answers TERMINATING when stopping takes over 3 s).
    await waitForState(svc.overNats, live[0]!.microvmId, ["TERMINATED"], 30_000);
    const next = await svc.overNats.runMicrovm({ idlePolicy: policy() });
    await Promise.all(
      [...live.slice(1), next].map((vm) => svc.overNats.terminateMicrovm({ microvmIdentifier: vm.microvmId })),
    );
    assert.deepEqual(svc.host.liveInstances(), []);
  });
});

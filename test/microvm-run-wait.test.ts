// RunMicrovm's defaults and its wait, over real HTTP (the gateway) and NATS (the public
// subject): no idlePolicy gets the documented one; `wait=running` answers once the runtime
// answers, and an instance still starting when the wait runs out is a 504 naming it.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { ClientError } from "../client/index.ts";
import { DEFAULT_IDLE_POLICY } from "../schemas/index.ts";
import { connectMicrovm, type SandboxShape } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import { assertNoInstanceLeft, startMicrovmService, waitForState, type MicrovmService } from "./helpers/microvm.ts";

const defer = lifo(after);
let svc: MicrovmService;

before(async () => {
  svc = await startMicrovmService(defer, {
    quotaPerPrincipal: 50,
    // Every start of the slow image is cold: once its first start left a launch snapshot (same
    // module bytes, another principal), a later one would be restored and never run out its wait.
    limits: { launchSnapshots: false },
  });
});
after(assertNoInstanceLeft);

type Answer = { status: number; body: Record<string, unknown> };

async function runOverHttp(query: string, body: unknown): Promise<Answer> {
  const res = await fetch(`${svc.microvmUrl}/2025-09-09/microvms${query}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** RunMicrovm on the public NATS subject (the `internal` user, a principal of its own: instances apart from HTTP's). */
async function runOverNats(input: Record<string, unknown>): Promise<Answer> {
  return svc.overNats.runMicrovm(input as never).then(
    (body) => ({ status: 200, body }),
    (err: unknown) => {
      if (!(err instanceof ClientError)) throw err;
      return { status: err.status, body: err.error as Record<string, unknown> };
    },
  );
}

/** The client of the principal that ran the instance: HTTP's anonymous or NATS's internal user. */
const clientOf = (over: string) => (over.startsWith("HTTP") ? svc.overHttp : svc.overNats);
const terminate = (over: string, microvmId: unknown) =>
  clientOf(over).terminateMicrovm({ microvmIdentifier: String(microvmId) });

/** The instance answers an RPC through its proxy right now (what RUNNING promises). */
async function answersNow(over: string, microvmId: string, endpoint: string): Promise<string> {
  const { authToken } = await clientOf(over).createAuthToken({
    microvmIdentifier: microvmId,
    expirationInMinutes: 5,
    allowedPorts: [{ port: 8080 }],
  });
  return connectMicrovm<SandboxShape>({ endpoint, authToken }).hello("now");
}

/** A self-contained image whose module takes `ms` to load (top-level await): its instances start that much later. */
const slowImage = (ms: number) => `
const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, fetch: () => new Response("no", { status: 404 }) });
await new Promise((resolve) => setTimeout(resolve, ${ms}));
export default defineImage({ methods: { hello: { handler: (m) => "slow " + m } } });
`;

describe("runMicrovm defaults and wait", () => {
  it("runMicrovm - without idlePolicy (or with part of one) the documented defaults apply, over HTTP and NATS", async () => {
    const cases: [string, () => Promise<Answer>, typeof DEFAULT_IDLE_POLICY][] = [
      ["HTTP {}", () => runOverHttp("", {}), DEFAULT_IDLE_POLICY],
      ["NATS {}", () => runOverNats({}), DEFAULT_IDLE_POLICY],
      [
        "HTTP part",
        () => runOverHttp("", { idlePolicy: { maxIdleDurationSeconds: 60 } }),
        { ...DEFAULT_IDLE_POLICY, maxIdleDurationSeconds: 60 },
      ],
      [
        "NATS part",
        () => runOverNats({ idlePolicy: { autoResumeEnabled: false } }),
        { ...DEFAULT_IDLE_POLICY, autoResumeEnabled: false },
      ],
    ];
    for (const [name, run, expected] of cases) {
      const { status, body } = await run();
      assert.equal(status, 200, `${name}: ${JSON.stringify(body)}`);
      const got = await clientOf(name).getMicrovm({ microvmIdentifier: String(body.microvmId) });
      await terminate(name, body.microvmId);
      assert.deepEqual(got.idlePolicy, expected, name);
    }
    assert.deepEqual(DEFAULT_IDLE_POLICY, {
      maxIdleDurationSeconds: 300,
      suspendedDurationSeconds: 600,
      autoResumeEnabled: true,
    });
  });

  it("runMicrovm - wait=running answers RUNNING once the runtime answers, over HTTP and NATS", async () => {
    for (const [name, run] of [
      ["HTTP", () => runOverHttp("?wait=running", {})],
      ["NATS", () => runOverNats({ wait: "running" })],
    ] as const) {
      const { status, body } = await run();
      assert.equal(status, 200, `${name}: ${JSON.stringify(body)}`);
      try {
        assert.equal(body.state, "RUNNING", name);
        assert.equal(await answersNow(name, String(body.microvmId), String(body.endpoint)), "hello, now!", name);
      } finally {
        await terminate(name, body.microvmId);
      }
    }
  });

  it("runMicrovm - a wait that runs out first is 504 MicrovmStartTimeout naming the instance, which goes on starting", async () => {
    // Each principal its own image: images are owned like instances. Its start (2.5 s) outlasts
    // the 1 s wait, and leaves the push check most of its 8 s for the sandbox itself on a slow
    // host (a 4 s start and two checks at once ran past it on one); one push at a time.
    for (const c of [svc.overHttp, svc.overNats]) await c.createImage({ name: "slow-start", module: slowImage(2_500) });
    for (const [name, run] of [
      ["HTTP", () => runOverHttp("?wait=running&waitSeconds=1", { imageIdentifier: "slow-start" })],
      ["NATS", () => runOverNats({ imageIdentifier: "slow-start", wait: "running", waitSeconds: 1 })],
    ] as const) {
      const started = Date.now();
      const { status, body } = await run();
      const waited = Date.now() - started;
      try {
        assert.equal(status, 504, `${name}: ${JSON.stringify(body)}`);
        assert.equal(body._tag, "MicrovmStartTimeout", name);
        assert.equal(body.state, "PENDING", name);
        assert.match(String(body.message), /still PENDING after 1 s/, name);
        assert.ok(waited >= 1_000 && waited < 4_000, `${name}: answered after ${waited} ms`);
        await waitForState(clientOf(name), String(body.microvmId), ["RUNNING"], 30_000);
      } finally {
        if (body.microvmId) await terminate(name, body.microvmId);
      }
    }
    await Promise.all([svc.overHttp, svc.overNats].map((c) => c.deleteImage({ name: "slow-start" })));
  });

  it("runMicrovm - waitSeconds outside 1-60 or wait other than running is a 400", async () => {
    for (const query of ["?wait=running&waitSeconds=0", "?wait=running&waitSeconds=61", "?wait=soon"]) {
      const { status, body } = await runOverHttp(query, {});
      assert.equal(status, 400, query);
      assert.equal(body._tag, "HttpApiDecodeError", query);
    }
    const { status } = await runOverNats({ wait: "running", waitSeconds: 0 });
    assert.equal(status, 400);
  });
});

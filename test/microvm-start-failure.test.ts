// A RunMicrovm whose instance fails once its runtime is up says why, to its user and to the
// operator: here an image that fit the host's memory when it was pushed no longer does after
// the host restarts with a smaller MICROVM_MEMORY_MIB; node runs out of heap while the image
// loads. GetMicrovm's stateReason names how the instance ended and node's error line, and the
// service logs the same with the instance's last stderr lines.
import { it } from "node:test";
import assert from "node:assert/strict";
import { loggedWithin, serviceDataDir, startServiceProcess } from "./helpers/process.ts";
import { getJson, postJson } from "./helpers/service.ts";
import { policy } from "./helpers/microvm.ts";

/** The service's bound on a start (MICROVM_START_TIMEOUT's default, 25 s), with room for a loaded machine. */
const START_BOUND_MS = 2 * 25_000;

/** Keeps about 96 MiB of arrays alive while it loads: it needs more heap than `SMALL_MEMORY_MIB`. */
const hungryModule = `const keep = [];
for (let i = 0; i < 48; i++) keep.push(new Array(256 * 1024).fill(i));
export default Object.freeze({
  kind: "typed-service/microvm-image",
  methods: { size: { handler: () => keep.length } },
  fetch: () => new Response("ok"),
});
`;
const SMALL_MEMORY_MIB = "48";

it("start failure - an image that outgrew the host's memory fails its run with node's reason in stateReason and the log", async (t) => {
  const dataDir = await serviceDataDir(t);
  const first = await startServiceProcess({ NATS_URL: "", DATA_DIR: dataDir });
  t.after(() => first.stop("SIGKILL"));
  const pushed = await postJson(`${first.microvmUrl}/2025-09-09/images`, { name: "hungry", module: hungryModule });
  assert.equal(pushed.status, 200, JSON.stringify(pushed.body));
  assert.equal(await first.stop(), 0);

  const second = await startServiceProcess({ NATS_URL: "", DATA_DIR: dataDir, MICROVM_MEMORY_MIB: SMALL_MEMORY_MIB });
  t.after(() => second.stop("SIGKILL"));
  const run = await postJson(`${second.microvmUrl}/2025-09-09/microvms`, {
    imageIdentifier: "hungry",
    idlePolicy: policy(),
  });
  assert.equal(run.status, 200, JSON.stringify(run.body));
  const { microvmId } = run.body as { microvmId: string };

  const failed = await failedWithin(`${second.microvmUrl}/2025-09-09/microvms/${microvmId}`, START_BOUND_MS);
  assert.match(
    String(failed.stateReason),
    new RegExp(
      `^StartFailed: instance ${microvmId} exited \\((SIG[A-Z]+|code \\d+)\\) before it was ready: FATAL ERROR: ` +
        `.*heap out of memory$`,
    ),
  );
  const logged = await loggedWithin(second, 5_000, (entry) => entry.microvmId === microvmId && entry.level === 40);
  assert.equal(logged.reason, String(failed.stateReason).replace(/^StartFailed: /, ""));
  assert.match(String(logged.exit), /^(SIG[A-Z]+|code \d+)$/);
  // The last stderr lines: here node's native stack, printed after its FATAL ERROR line.
  assert.match(String(logged.stderr), /heap out of memory|Native stack trace/);
  assert.equal(await second.stop(), 0);
});

/** GetMicrovm until the instance is FAILED; fails once `timeoutMs` has passed. */
async function failedWithin(url: string, timeoutMs: number): Promise<Record<string, unknown>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { body } = await getJson(url);
    const record = body as Record<string, unknown>;
    if (record.state === "FAILED") return record;
    assert.ok(Date.now() < deadline, `not FAILED within ${timeoutMs} ms: ${JSON.stringify(record)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// Images against the limits of a real host and real sandboxed instances: checking a push takes
// a live-instance slot (429 at the owner's quota or a full host); the module cache stays in its
// bound without touching a running instance's module; a delete racing a launch of the same
// image ends consistent (either the delete is refused or the launch gives way).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import type { ClientError } from "../client/index.ts";
import { httpClient } from "../client/index.ts";
import { newApiKey, parseApiKeys } from "../gateway/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import { lifo } from "./helpers/defer.ts";
import {
  assertNoInstanceLeft,
  policy,
  startMicrovmService,
  waitForState,
  type MicrovmService,
} from "./helpers/microvm.ts";

const defer = lifo(after);
after(assertNoInstanceLeft);
const principals = { alice: newApiKey("alice"), bob: newApiKey("bob"), carol: newApiKey("carol") };
const keys = parseApiKeys(
  Object.values(principals)
    .map((key) => key.line)
    .join("\n"),
);

const inlineDefineImage =
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", ` +
  `methods: d.methods, fetch: d.fetch ?? (() => new Response("no", { status: 404 })) });`;
/** A module whose `greet` answers `<greeting>, <name>`, padded with a comment to `padKiB`. */
const greeter = (greeting: string, padKiB = 0) =>
  `${inlineDefineImage}\nexport default defineImage({ methods: { greet: { handler: (name) => ` +
  `${JSON.stringify(greeting)} + ", " + name } } });\n` +
  (padKiB ? `// ${"x".repeat(padKiB * 1024)}\n` : "");

let svc: MicrovmService;
const as = (who: keyof typeof principals) => httpClient(microvmApi, svc.microvmUrl, { apiKey: principals[who].key });
const failure = (promise: Promise<unknown>) =>
  promise.then(
    () => assert.fail("expected a failure"),
    (err: ClientError) => ({
      status: err.status,
      body: err.error as unknown as { _tag: string; message?: string; quota?: number; limit?: number },
    }),
  );

before(async () => {
  // Two live instances per host, one per principal; a 1 MiB module cache.
  svc = await startMicrovmService(
    defer,
    { hostId: "image-limits", maxInstances: 2, quotaPerPrincipal: 1, imageCacheMiB: 1 },
    { apiKeys: keys },
  );
});

async function greet(who: keyof typeof principals, microvmId: string, endpoint: string): Promise<string> {
  await waitForState(as(who), microvmId, ["RUNNING"], 30_000);
  const { authToken } = await as(who).createAuthToken({
    microvmIdentifier: microvmId,
    expirationInMinutes: 5,
    allowedPorts: [{ port: 8080 }],
  });
  return connectMicrovm<{ greet(name: string): Promise<string> }>({ endpoint, authToken }).greet("x");
}

/** Terminates `who`'s instances and waits until none is live (each took a slot of the quota). */
async function endAll(who: keyof typeof principals): Promise<void> {
  for (const { microvmId, state } of (await as(who).listMicrovms({})).items) {
    if (state === "TERMINATED" || state === "FAILED") continue;
    await as(who)
      .terminateMicrovm({ microvmIdentifier: microvmId })
      .catch(() => undefined);
    await waitForState(as(who), microvmId, ["TERMINATED", "FAILED"], 30_000);
  }
}

async function run(who: keyof typeof principals, imageIdentifier: string) {
  const started = await as(who).runMicrovm({ imageIdentifier, idlePolicy: policy() });
  defer(() =>
    as(who)
      .terminateMicrovm({ microvmIdentifier: started.microvmId })
      .catch(() => undefined),
  );
  return started;
}

describe("image limits", () => {
  it("image limits - a push at the owner's quota is a 429 MicrovmQuotaExceeded; a full host a 429 MicrovmLimitExceeded", async () => {
    await as("alice").createImage({ name: "quota", module: greeter("q") });
    const alices = await run("alice", "quota");
    const atQuota = await failure(as("alice").createImage({ name: "quota-2", module: greeter("q2") }));
    assert.deepEqual([atQuota.status, atQuota.body._tag, atQuota.body.quota], [429, "MicrovmQuotaExceeded", 1]);
    assert.match(atQuota.body.message!, /checking an image runs it in an instance.*quota of 1 live instances/);
    assert.equal((await failure(as("alice").getImage({ name: "quota-2" }))).status, 404, "nothing was registered");

    await as("bob").createImage({ name: "full", module: greeter("f") }); // 1 live + bob's check = 2: fits
    const bobs = await run("bob", "full");
    const full = await failure(as("carol").createImage({ name: "full", module: greeter("c") }));
    assert.deepEqual([full.status, full.body._tag, full.body.limit], [429, "MicrovmLimitExceeded", 2]);
    assert.match(full.body.message!, /checking an image runs it in an instance.*maximum of 2 live instances/);

    assert.ok(alices.microvmId && bobs.microvmId);
    await endAll("alice");
    assert.equal(
      (await as("carol").createImage({ name: "full", module: greeter("c") })).name,
      "full",
      "a slot freed, the push goes through",
    );
    await endAll("bob");
  });

  it("image limits - the module cache stays in its bound; a running instance's module stays and it keeps answering", async () => {
    const cacheDir = join(svc.host.workDir, "image-cache");
    await as("alice").createImage({ name: "kept", module: greeter("kept", 300) });
    const kept = await run("alice", "kept");
    assert.equal(await greet("alice", kept.microvmId, kept.endpoint), "kept, x");
    const keptDigest = (await as("alice").getMicrovm({ microvmIdentifier: kept.microvmId })).imageDigest!;
    for (const n of [1, 2, 3, 4]) await as("bob").createImage({ name: `filler-${n}`, module: greeter(`f${n}`, 300) });
    const files = (await readdir(cacheDir)).filter((file) => file.endsWith(".mjs"));
    const bytes = (await Promise.all(files.map((file) => stat(join(cacheDir, file))))).reduce(
      (sum, info) => sum + info.size,
      0,
    );
    assert.ok(bytes <= 1024 * 1024, `the cache holds ${bytes} bytes in ${files.length} modules, over its 1 MiB bound`);
    assert.ok(
      existsSync(join(cacheDir, `${keptDigest.slice(7)}.mjs`)),
      "the running instance's module was not evicted",
    );
    assert.equal(await greet("alice", kept.microvmId, kept.endpoint), "kept, x");
    await endAll("alice");
    // An evicted module is fetched again on its next launch.
    const again = await run("bob", "filler-1");
    assert.equal(await greet("bob", again.microvmId, again.endpoint), "f1, x");
    await endAll("bob");
  });

  it("image limits - a delete racing a launch of the same image: the delete is refused, or the launch gives way", async (t) => {
    const outcomes: string[] = [];
    for (let round = 0; round < 4; round++) {
      await as("carol").createImage({ name: "contested", module: greeter(`r${round}`) });
      const [launched, deleted] = await Promise.allSettled([
        as("carol").runMicrovm({ imageIdentifier: "contested", idlePolicy: policy() }),
        as("carol").deleteImage({ name: "contested" }),
      ]);
      if (launched.status === "fulfilled")
        defer(() =>
          as("carol")
            .terminateMicrovm({ microvmIdentifier: launched.value.microvmId })
            .catch(() => undefined),
        );
      if (deleted.status === "rejected") {
        // Refused: the image and its instance are intact.
        assert.equal(
          (deleted.reason as ClientError).status,
          409,
          `round ${round}: ${JSON.stringify((deleted.reason as ClientError).error)}`,
        );
        assert.equal(launched.status, "fulfilled", `round ${round}: the delete saw an instance that did not launch`);
        const { microvmId, endpoint } = (launched as PromiseFulfilledResult<{ microvmId: string; endpoint: string }>)
          .value;
        assert.equal(await greet("carol", microvmId, endpoint), `r${round}, x`);
        await endAll("carol");
        await as("carol").deleteImage({ name: "contested" });
        outcomes.push("delete refused");
      } else {
        // Deleted: no instance of it lives on.
        if (launched.status === "fulfilled") {
          const state = await waitForState(
            as("carol"),
            launched.value.microvmId,
            ["TERMINATED", "FAILED"],
            10_000,
          ).catch(() => "live");
          assert.notEqual(state, "live", `round ${round}: an instance of a deleted image lives on`);
          outcomes.push("launch ended");
        } else {
          assert.equal(
            (launched.reason as ClientError).status,
            404,
            `round ${round}: ${JSON.stringify((launched.reason as ClientError).error)}`,
          );
          outcomes.push("launch refused");
        }
      }
      assert.equal(
        (await failure(as("carol").getImage({ name: "contested" }))).status,
        404,
        `round ${round}: the image is gone at the end`,
      );
      await endAll("carol");
    }
    // Which way each race went is reported, not asserted: either outcome is right (checked above).
    t.diagnostic(`outcomes: ${outcomes.join(", ")}`);
  });
});

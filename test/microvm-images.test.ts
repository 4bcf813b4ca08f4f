// Images users bring, against real NATS (auth on) and real sandboxed instances: push over REST
// and NATS, run on a host that never saw the push, call through the proxy; bad modules are
// 400s; delete while running is a 409; `name@digest` pins a version; owners see only theirs.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { runCli } from "../client/cli.ts";
import { httpClient, type ClientError } from "../client/index.ts";
import { MicrovmStore } from "../vm-runtime/service/index.ts";
import { newApiKey, parseApiKeys } from "../gateway/index.ts";
import { MAX_IMAGE_MODULE_BYTES, microvmApi } from "../schemas/index.ts";
import { bundleImageModule } from "../vm-runtime/service/index.ts";
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
const alice = newApiKey("alice");
const bob = newApiKey("bob");
const keys = parseApiKeys(`${alice.line}\n${bob.line}\n`);

/** A self-contained module whose `greet` answers `<greeting>, <name>`. */
const greeter = (greeting: string) => `
${inlineDefineImage}
export default defineImage({ methods: { greet: { handler: (name) => ${JSON.stringify(greeting)} + ", " + name } } });
`;
/** `defineImage` without imports: what a bundler inlines (the kind tag is all the runtime checks). */
const inlineDefineImage =
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", ` +
  `methods: d.methods, fetch: d.fetch ?? (() => new Response("no", { status: 404 })) });`;

let svc: MicrovmService;
const asAlice = () => httpClient(microvmApi, svc.microvmUrl, { apiKey: alice.key });
const asBob = () => httpClient(microvmApi, svc.microvmUrl, { apiKey: bob.key });
const failure = (promise: Promise<unknown>) =>
  promise.then(
    () => assert.fail("expected a failure"),
    (err: ClientError) => ({ status: err.status, body: err.error as unknown as { _tag: string; message?: string } }),
  );

before(async () => {
  svc = await startMicrovmService(defer, { hostId: "images-a" }, { apiKeys: keys });
});

async function callGreet(client: ReturnType<typeof asAlice>, microvmId: string, endpoint: string, who: string) {
  await waitForState(client, microvmId, ["RUNNING"], 30_000);
  const { authToken } = await client.createAuthToken({
    microvmIdentifier: microvmId,
    expirationInMinutes: 5,
    allowedPorts: [{ port: 8080 }],
  });
  return connectMicrovm<{ greet(name: string): Promise<string> }>({ endpoint, authToken }).greet(who);
}

describe("images", () => {
  it("images - push over REST answers the digest and methods; get and list show it", async () => {
    const image = await asAlice().createImage({ name: "rest-greeter", module: greeter("hi") });
    assert.equal(image.name, "rest-greeter");
    assert.match(image.digest, /^sha256:[0-9a-f]{64}$/);
    assert.deepEqual(image.methods, [{ name: "greet" }]);
    assert.deepEqual(await asAlice().getImage({ name: "rest-greeter" }), image);
    const names = (await asAlice().listImages({})).items.map((item) => item.name);
    assert.deepEqual(names, ["rest-greeter", "sandbox"]);
  });

  it("images - an image pushed over NATS runs on a second host that never saw the push, through the proxy", async () => {
    const pushed = await svc.overNats.createImage({ name: "nats-greeter", module: greeter("hello") });
    const { host: hostB } = await svc.addHost({ hostId: "images-b" });
    const store = new MicrovmStore(svc.kv, svc.handle.nc);
    const cacheB = `${hostB.workDir}/image-cache`;
    assert.ok(
      !(await readdir(cacheB)).some((file) => file.startsWith(pushed.digest.slice(7))),
      "host b has not cached it",
    );
    for (let attempt = 0; attempt < 40; attempt++) {
      const run = await svc.overNats.runMicrovm({ imageIdentifier: "nats-greeter", idlePolicy: policy() });
      const onB = (await store.read(run.microvmId))?.record.hostId === "images-b";
      if (onB) {
        assert.equal(await callGreet(svc.overNats, run.microvmId, run.endpoint, "b"), "hello, b");
        assert.equal((await svc.overNats.getMicrovm({ microvmIdentifier: run.microvmId })).imageDigest, pushed.digest);
        assert.ok(
          (await readdir(cacheB)).includes(`${pushed.digest.slice(7)}.mjs`),
          "host b cached the module by digest",
        );
      }
      await svc.overNats.terminateMicrovm({ microvmIdentifier: run.microvmId });
      if (onB) return;
    }
    assert.fail("no run landed on host b");
  });

  it("images - bad modules are 400 InvalidImage with a useful message and no host paths", async () => {
    const cases: [string, string, RegExp][] = [
      ["syntax error", "const a = 1;\nexport default {", /SyntaxError: Unexpected end of input \(line 2:\d+\)/],
      [
        "syntax error mid-module",
        "const a = 1;\nconst b = 2;\nlet x = 3 4;\n",
        /: SyntaxError: Unexpected number \(line 3:11\)$/,
      ],
      [
        "no default export",
        `${inlineDefineImage}\nexport const image = defineImage({ methods: {} });`,
        /default export is not an image \(use defineImage\)/,
      ],
      ["default is not an image", "export default { methods: {} };", /default export is not an image/],
      [
        "throws at load",
        `throw new RangeError("the config is missing");\nexport default 1;`,
        /RangeError: the config is missing/,
      ],
      [
        "unbundled import",
        `import x from "left-pad";\nexport default x;`,
        /ImageError: the module imports "left-pad" \(line 1\): an image module can import only node builtins/,
      ],
    ];
    for (const [label, module, expected] of cases) {
      const { status, body } = await failure(asAlice().createImage({ name: "bad", module }));
      assert.equal(status, 400, label);
      assert.equal(body._tag, "InvalidImage", label);
      assert.match(body.message!, expected, `${label}: ${body.message}`);
      assert.ok(
        !body.message!.includes(svc.dataDir) && !body.message!.includes("/tmp"),
        `${label} shows a host path: ${body.message}`,
      );
    }
    const oversized = `${greeter("big")}\n// ${"x".repeat(MAX_IMAGE_MODULE_BYTES)}`;
    const { status, body } = await failure(svc.overNats.createImage({ name: "bad", module: oversized }));
    assert.equal(status, 400);
    assert.match(body.message!, /limit is 4194304 bytes/);
    assert.equal((await failure(asAlice().getImage({ name: "bad" }))).status, 404, "nothing was registered");
  });

  it("images - an image importing an npm package works once bundled by the pusher", async () => {
    const module = await bundleImageModule(fileURLToPath(new URL("./images/uses-npm.ts", import.meta.url)));
    const image = await asAlice()
      .createImage({ name: "uses-npm", module })
      .catch((err: ClientError) => assert.fail(JSON.stringify(err.error)));
    assert.deepEqual(
      image.methods.map((m) => m.name),
      ["newId", "isId"],
    );
    const run = await asAlice().runMicrovm({ imageIdentifier: "uses-npm", idlePolicy: policy() });
    defer(() =>
      asAlice()
        .terminateMicrovm({ microvmIdentifier: run.microvmId })
        .catch(() => undefined),
    );
    await waitForState(asAlice(), run.microvmId, ["RUNNING"], 30_000);
    const { authToken } = await asAlice().createAuthToken({
      microvmIdentifier: run.microvmId,
      expirationInMinutes: 5,
      allowedPorts: [{ port: 8080 }],
    });
    const stub = connectMicrovm<{ newId(): Promise<string>; isId(text: string): Promise<boolean> }>({
      endpoint: run.endpoint,
      authToken,
    });
    assert.equal(await stub.isId(await stub.newId()), true);
    assert.equal(await stub.isId("nope"), false);
    await asAlice().terminateMicrovm({ microvmIdentifier: run.microvmId });
  });

  it("images - delete while a live instance runs it is a 409, after terminate 200, then 404", async () => {
    await asAlice().createImage({ name: "doomed", module: greeter("bye") });
    const run = await asAlice().runMicrovm({ imageIdentifier: "doomed", idlePolicy: policy() });
    const busy = await failure(asAlice().deleteImage({ name: "doomed" }));
    assert.equal(busy.status, 409);
    assert.equal(busy.body._tag, "ImageInUse");
    assert.match(busy.body.message!, new RegExp(run.microvmId));
    await asAlice().terminateMicrovm({ microvmIdentifier: run.microvmId });
    assert.deepEqual(await asAlice().deleteImage({ name: "doomed" }), { name: "doomed" });
    assert.equal((await failure(asAlice().getImage({ name: "doomed" }))).status, 404);
    assert.equal(
      (await failure(asAlice().runMicrovm({ imageIdentifier: "doomed", idlePolicy: policy() }))).body._tag,
      "ImageNotFound",
    );
    assert.equal((await failure(asAlice().deleteImage({ name: "sandbox" }))).status, 409, "the built-in image stays");
  });

  it("images - name@digest pins an old version after a re-push; GetMicrovm reports the digest", async () => {
    const v1 = await asAlice().createImage({ name: "versioned", module: greeter("v1") });
    const v2 = await asAlice().createImage({ name: "versioned", module: greeter("v2") });
    assert.notEqual(v1.digest, v2.digest);
    assert.equal((await asAlice().getImage({ name: "versioned" })).digest, v2.digest);
    const pinned = await asAlice().runMicrovm({ imageIdentifier: `versioned@${v1.digest}`, idlePolicy: policy() });
    const latest = await asAlice().runMicrovm({ imageIdentifier: "versioned", idlePolicy: policy() });
    try {
      assert.equal(await callGreet(asAlice(), pinned.microvmId, pinned.endpoint, "x"), "v1, x");
      assert.equal(await callGreet(asAlice(), latest.microvmId, latest.endpoint, "x"), "v2, x");
      assert.equal((await asAlice().getMicrovm({ microvmIdentifier: pinned.microvmId })).imageDigest, v1.digest);
      assert.equal((await asAlice().getMicrovm({ microvmIdentifier: latest.microvmId })).imageDigest, v2.digest);
    } finally {
      await asAlice().terminateMicrovm({ microvmIdentifier: pinned.microvmId });
      await asAlice().terminateMicrovm({ microvmIdentifier: latest.microvmId });
    }
  });

  it("images - another principal cannot see, run or delete your image; everyone sees sandbox", async () => {
    await asAlice().createImage({ name: "alices", module: greeter("mine") });
    assert.equal((await failure(asBob().getImage({ name: "alices" }))).status, 404);
    assert.equal((await failure(asBob().deleteImage({ name: "alices" }))).status, 404);
    assert.equal((await failure(asBob().runMicrovm({ imageIdentifier: "alices", idlePolicy: policy() }))).status, 404);
    assert.equal(
      (await failure(svc.overNats.getImage({ name: "alices" }))).status,
      404,
      "nats:internal is another principal",
    );
    assert.deepEqual(
      (await asBob().listImages({})).items.map((item) => item.name),
      ["sandbox"],
    );
    assert.equal((await asAlice().getImage({ name: "alices" })).name, "alices");
  });

  it("images - taskctl image push bundles an npm-using file, ls/get show it, microvm run --image runs it, rm deletes it", async () => {
    const taskctl = async (...argv: string[]) => {
      let out = "";
      let err = "";
      const env = { MICROVM_API_URL: svc.microvmUrl, TASKCTL_API_KEY: alice.key };
      const status = await runCli(argv, {
        out: (text) => (out += `${text}\n`),
        err: (text) => (err += `${text}\n`),
        env,
      });
      return { status, out, err };
    };
    const file = fileURLToPath(new URL("./images/uses-npm.ts", import.meta.url));
    const pushed = await taskctl("image", "push", file, "--name", "cli-image");
    assert.equal(pushed.status, 0, pushed.err);
    assert.match(pushed.out, /pushed cli-image@sha256:[0-9a-f]{64}/);
    assert.match(pushed.out, /newId, isId/);
    // A module that throws while loading: the push fails with what its instance wrote, in its words.
    const broken = join(await mkdtemp(join(tmpdir(), "broken-image-")), "broken.mjs");
    await writeFile(broken, 'console.error("reading the config");\nthrow new RangeError("the config is missing");\n');
    const failed = await taskctl("image", "push", broken, "--name", "cli-broken");
    assert.equal(failed.status, 1);
    assert.match(failed.err, /invalid image: the module does not load as an image: RangeError: the config is missing/);
    assert.match(failed.err, /its output:\n(  \| .*\n)*  \| reading the config\n/);
    assert.match(failed.err, /  \| RangeError: the config is missing/);
    assert.doesNotMatch(failed.err, /\/tmp\/|\/work\//, "no path of the host's");
    await rm(dirname(broken), { recursive: true, force: true });
    const listed = await taskctl("image", "ls");
    assert.match(listed.out, /^cli-image\s/m);
    assert.match(listed.out, /^sandbox\s/m);
    const got = await taskctl("image", "get", "cli-image", "--json");
    assert.equal((JSON.parse(got.out) as { name: string }).name, "cli-image");
    const run = await taskctl("microvm", "run", "--image", "cli-image", "--wait", "--json");
    assert.equal(run.status, 0, run.err);
    const vm = JSON.parse(run.out) as { microvmId: string; state: string; imageDigest: string };
    assert.equal(vm.state, "RUNNING");
    assert.equal(vm.imageDigest, (JSON.parse(got.out) as { digest: string }).digest);
    const refused = await taskctl("image", "rm", "cli-image");
    assert.equal(refused.status, 1);
    assert.match(refused.err, /ImageInUse|live instances run cli-image/);
    assert.equal((await taskctl("microvm", "terminate", vm.microvmId)).status, 0);
    const removed = await taskctl("image", "rm", "cli-image");
    assert.equal(removed.status, 0, removed.err);
    assert.equal((await taskctl("image", "get", "cli-image")).status, 1);
  });

  it("images - OpenAPI lists the image operations", async () => {
    const doc = (await (await fetch(`${svc.microvmUrl}/openapi.json`)).json()) as {
      paths: Record<string, Record<string, { operationId?: string }>>;
    };
    assert.equal(doc.paths["/2025-09-09/images"]?.post?.operationId, "createImage");
    assert.equal(doc.paths["/2025-09-09/images"]?.get?.operationId, "listImages");
    assert.equal(doc.paths["/2025-09-09/images/{name}"]?.get?.operationId, "getImage");
    assert.equal(doc.paths["/2025-09-09/images/{name}"]?.delete?.operationId, "deleteImage");
  });
});

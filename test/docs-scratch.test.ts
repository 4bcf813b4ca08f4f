// The docs test's scratch directory and planted files, on a checkout made up here: what is
// copied, what is linked, what is never taken, and a user's own file never removed.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { lstat, mkdir, mkdtemp, readFile, readlink, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { changedFiles, plantFiles, removePlanted } from "./helpers/planted-files.ts";
import { gitignored, scratchCheckout } from "./helpers/scratch-checkout.ts";

/** A checkout with sources, an install, a build, and the files a user keeps in it. */
async function checkout(t: { after(fn: () => unknown): void }): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), "docs-scratch-"));
  t.after(() => rm(root, { recursive: true, force: true }));
  const files: Record<string, string> = {
    ".gitignore": "node_modules\n.data/\ndist\napi-keys\n*.key\nbench/results/*.json\n",
    "client/index.ts": "export {};\n",
    "bench/results/run.json": "{}\n",
    "bench/run.ts": "export {};\n",
    "node_modules/x/index.js": "\n",
    "dist/main.mjs": "\n",
    ".data/nats-url": "nats://127.0.0.1:4222\n",
    "api-keys": "alice 5f0c\n",
    "docs/alice.key": "key: tsk_secret\n",
    "my-image.ts": "export default 1;\n",
  };
  for (const [path, text] of Object.entries(files)) {
    await mkdir(join(root, path, ".."), { recursive: true });
    await writeFile(join(root, path), text);
  }
  return root;
}

describe("docs scratch directory", () => {
  it("docs scratch - copies what git would not ignore, links the install and the build, takes no secret", async (t) => {
    const root = await checkout(t);
    const work = await scratchCheckout(root);
    t.after(() => rm(work, { recursive: true, force: true }));
    for (const copied of [".gitignore", "client/index.ts", "bench/run.ts", "my-image.ts"])
      assert.ok((await lstat(join(work, copied))).isFile(), `${copied} is copied`);
    for (const linked of ["node_modules", "dist"]) assert.equal(await readlink(join(work, linked)), join(root, linked));
    for (const left of ["api-keys", "docs/alice.key", ".data", "bench/results/run.json"])
      assert.equal(await lstat(join(work, left)).catch(() => "absent"), "absent", `${left} is not taken`);
    await writeFile(join(work, "my-image.ts"), "export default 2;\n");
    assert.equal(await readFile(join(root, "my-image.ts"), "utf8"), "export default 1;\n");
  });

  it("docs scratch - a .gitignore form it cannot read is refused, not guessed", () => {
    for (const pattern of ["!keep.key", "**/secrets", "key?.pem", "[ab].key"])
      assert.throws(() => gitignored(pattern), /cannot read/, pattern);
    assert.ok(gitignored("/api-keys")("api-keys", false));
    assert.ok(!gitignored(".data/")(".data", false), "a directory pattern leaves a file of that name");
  });

  it("docs scratch - planted files are compared and removed; a user's own file is compared and kept", async (t) => {
    const root = await checkout(t);
    const planted = await plantFiles(root, ["api-keys", "x.key", "openapi.json", "docs/y.key", "no-dir/z.key"]);
    assert.deepEqual(
      planted.map((p) => [p.name, p.ours]),
      [
        ["api-keys", false],
        ["x.key", true],
        ["openapi.json", true],
        ["docs/y.key", true],
      ],
    );
    assert.deepEqual(await changedFiles(root, planted), []);
    JSON.parse(await readFile(join(root, "openapi.json"), "utf8"));
    await writeFile(join(root, "api-keys"), "alice 5f0c\nmallory 0000\n");
    await rm(join(root, "x.key"));
    assert.deepEqual(await changedFiles(root, planted), ['api-keys: "alice 5f0c\\nmallory 0000\\n"', "x.key: ENOENT"]);
    await removePlanted(root, planted);
    assert.equal(await readFile(join(root, "api-keys"), "utf8"), "alice 5f0c\nmallory 0000\n", "the user's file stays");
    for (const name of ["openapi.json", "docs/y.key"])
      assert.equal(await lstat(join(root, name)).catch(() => "absent"), "absent", `${name} is removed`);
  });

  it("docs scratch - a file a killed run planted is taken as planted, not as the user's", async (t) => {
    const root = await checkout(t);
    const first = await plantFiles(root, ["x.key"]);
    const again = await plantFiles(root, ["x.key"]);
    assert.deepEqual(
      again.map((p) => p.ours),
      [true],
    );
    assert.notDeepEqual(again[0]!.content, first[0]!.content, "planted again, with new contents");
    await removePlanted(root, again);
    assert.equal(await lstat(join(root, "x.key")).catch(() => "absent"), "absent");
  });
});

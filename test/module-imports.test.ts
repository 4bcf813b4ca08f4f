// The import check the runtime runs inside an instance before it imports an image module:
// what it refuses (naming the import and its line), what it lets through, and the runtime's
// builtin-only `require`.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  builtinRequire,
  checkModuleImports,
  ImageError,
  importCheckReady,
} from "../vm-runtime/runtime/module-imports.ts";

await importCheckReady;

const refusal = (source: string) => {
  try {
    checkModuleImports(source);
  } catch (error) {
    assert.ok(error instanceof ImageError, String(error));
    return error.message;
  }
  return assert.fail("the module was let through");
};

describe("module imports", () => {
  it("module imports - every form of a non-builtin import is refused, named with its line", () => {
    const cases: [string, string][] = [
      [`import x from "/etc/passwd";`, `"/etc/passwd" (line 1)`],
      [`// one\nimport x from "../seed" with { type: "text" };`, `"../seed" (line 2)`],
      [`\n\nexport * from "./other.js";`, `"./other.js" (line 3)`],
      [`export { a } from "left-pad";`, `"left-pad" (line 1)`],
      [`const z = await import("/dev/zero", { with: { type: "text" } });`, `"/dev/zero" (line 1)`],
      [`import e from "\\u002fproc/self/environ" with { type: "json" };`, `"/proc/self/environ" (line 1)`],
      // biome-ignore lint/suspicious/noTemplateCurlyInString: the module's own template literal
      ["const m = import(`/app/${name}.json`);", `"/app/*.json" (line 1)`],
      [`import "data:text/javascript,export default 1";`, `"data:text/javascript,export default 1" (line 1)`],
    ];
    for (const [source, named] of cases) {
      const message = refusal(source);
      assert.ok(message.startsWith(`the module imports ${named}: `), `${source} → ${message}`);
      assert.match(message, /an image module can import only node builtins; bundle everything else into it$/);
    }
  });

  it("module imports - builtins, import.meta, computed dynamic imports and look-alikes in strings pass", () => {
    const source = [
      `import fs from "node:fs";`,
      `import { createServer } from "http";`,
      `export * from "node:path";`,
      "const url = import.meta.url;",
      `const lazy = await import("node:crypto");`,
      "const computed = (name) => import(name);",
      `const text = "import x from '/etc/passwd'";`,
      `// import y from "/etc/shadow";`,
    ].join("\n");
    assert.equal(checkModuleImports(source), true);
  });

  it("module imports - a module the lexer cannot read is left to node's parser", () => {
    assert.equal(checkModuleImports(`const s = "unterminated\nimport x from "/etc/passwd";`), false);
  });

  it("module imports - a long specifier is quoted cut, on one line", () => {
    const message = refusal(`import x from "/${"a".repeat(5000)}\\n";`);
    assert.ok(message.length < 400, `${message.length} chars`);
    assert.ok(!message.includes("\n"));
  });

  it("module imports - the runtime's require loads builtins only", () => {
    const require = builtinRequire(import.meta.url);
    assert.equal(typeof require("node:path").join, "function");
    // biome-ignore lint/style/useNodejsImportProtocol: a builtin without the prefix loads too
    assert.equal(typeof require("fs").readFileSync, "function");
    assert.throws(() => require("/etc/passwd"), ImageError);
    assert.throws(() => require("./module-imports.test.ts"), /can require only node builtins/);
    assert.throws(() => require.resolve("left-pad"), ImageError);
  });
});

// Inside the instance, before an image module is imported: its imports are read by a lexer
// (es-module-lexer's WebAssembly build, bundled into the runtime: its pure-JS build took 100-165
// ms over a 94 KB module on a gVisor wall, this one 10-25) and any that is not a node builtin
// is refused, naming the import and never reading what it names. The `require` the
// runtime gives image code loads node builtins only.
import { createRequire, isBuiltin } from "node:module";
import { init, parse } from "es-module-lexer";

let lexerReady = false;
/** Resolves once the lexer (WebAssembly) is compiled: `checkModuleImports` refuses to run before. */
export const importCheckReady: Promise<void> = init().then(() => {
  lexerReady = true;
});

/** A module that cannot be an image for what it imports; the message is one line. */
export class ImageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ImageError";
  }
}

/** Longest part of a specifier quoted in a refusal. */
const QUOTED_SPECIFIER_CHARS = 200;

/**
 * Throws an `ImageError` for the first import of `source` that is not a node builtin: static
 * imports and `export … from` (attributes or not) and dynamic imports of a literal or a
 * template. A dynamic import of a computed value cannot be read before it runs: it resolves
 * inside the instance. Returns false when the lexer cannot read the module (node's parser
 * then says what is wrong, and where, before it resolves any import).
 */
export function checkModuleImports(source: string): boolean {
  // Before its compile, the lexer's failure would read as "cannot read the module": not checked.
  if (!lexerReady) throw new Error("the import check ran before its lexer was compiled (await importCheckReady)");
  let imports: ReturnType<typeof parse>[0];
  try {
    [imports] = parse(source);
  } catch {
    return false;
  }
  for (const entry of imports) {
    if (entry.type === "import-meta") continue;
    const specifier = entry.specifier;
    if (specifier === undefined || isBuiltin(specifier)) continue;
    const quoted = JSON.stringify(specifier.slice(0, QUOTED_SPECIFIER_CHARS));
    throw new ImageError(
      `the module imports ${quoted} (line ${lineAt(source, entry.importStart)}): ` +
        "an image module can import only node builtins; bundle everything else into it",
    );
  }
  return true;
}

/** 1-based line of offset `index` in `text`. */
function lineAt(text: string, index: number): number {
  let line = 1;
  for (let at = text.indexOf("\n"); at !== -1 && at < index; at = text.indexOf("\n", at + 1)) line += 1;
  return line;
}

/**
 * A `require` that loads node builtins only (CommonJS code bundled into an image asks for
 * `fs`, `path`…); anything else is an `ImageError`, resolved by nothing.
 */
export function builtinRequire(from: string | URL): NodeJS.Require {
  const nodeRequire = createRequire(from);
  const refuse = (id: string) =>
    new ImageError(
      `require(${JSON.stringify(String(id).slice(0, QUOTED_SPECIFIER_CHARS))}): ` +
        "an image module can require only node builtins",
    );
  const builtinOnly = (id: string) => {
    if (typeof id !== "string" || !isBuiltin(id)) throw refuse(id);
    return nodeRequire(id);
  };
  const resolve = (id: string) => {
    if (typeof id !== "string" || !isBuiltin(id)) throw refuse(id);
    return id;
  };
  resolve.paths = () => null;
  return Object.assign(builtinOnly, {
    resolve,
    cache: Object.create(null),
    extensions: Object.create(null),
    main: undefined,
  }) as unknown as NodeJS.Require;
}

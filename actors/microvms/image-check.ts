// Checking a module before it becomes an image, never by loading it in the host process: it
// is parsed by esbuild (a syntax or import error stops here), started in a sandboxed
// instance of this host's provider, asked for its methods, and terminated.
import { randomUUID } from "node:crypto";
import { request } from "node:http";
import { MAX_IMAGE_MODULE_BYTES, InvalidImage } from "../../schemas/index.ts";
import {
  checkModuleBuilds,
  RPC_HEALTH_PATH,
  upstreamOf,
  RUNTIME_PORT,
  type MethodDescription,
  type MicrovmHandle,
  type MicrovmProvider,
} from "../../vm-runtime/index.ts";

/** Fails with a 400 `InvalidImage` when the module is larger than the limit. */
export function checkModuleSize(module: Uint8Array): void {
  if (module.byteLength <= MAX_IMAGE_MODULE_BYTES) return;
  throw InvalidImage.make({
    message: `the module is ${module.byteLength} bytes; the limit is ${MAX_IMAGE_MODULE_BYTES} bytes (4 MiB)`,
  });
}

/**
 * Starts the module at `path` (written by the caller) in an instance and resolves with its
 * methods; a module that does not build, load or define an image is a 400 `InvalidImage`.
 */
export async function checkImageModule(path: string, provider: MicrovmProvider): Promise<MethodDescription[]> {
  try {
    await checkModuleBuilds(path);
  } catch (err) {
    throw InvalidImage.make({ message: buildFailure(err) }, { cause: err });
  }
  let handle: MicrovmHandle;
  try {
    handle = await provider.start({ microvmId: `image-check-${randomUUID()}`, image: path });
  } catch (err) {
    throw InvalidImage.make({ message: `the module does not load as an image: ${loadFailure(err)}` }, { cause: err });
  }
  try {
    return await methodsOf(handle);
  } finally {
    await provider.terminate(handle, 500).catch(() => undefined);
  }
}

interface BuildMessage {
  readonly text: string;
  readonly location?: { readonly line: number; readonly column: number } | null;
}

/** esbuild's first errors with their line and column in the module (no file paths). */
function buildFailure(err: unknown): string {
  const errors = (err as { errors?: BuildMessage[] }).errors;
  if (!Array.isArray(errors) || errors.length === 0) return "the module does not build";
  const described = errors.slice(0, 3).map(({ text, location }) => {
    const hint = /^Could not resolve/.test(text)
      ? " (a module must be self-contained: bundle its dependencies, as `taskctl image push` does)"
      : "";
    return location ? `line ${location.line}:${location.column + 1}: ${text}${hint}` : `${text}${hint}`;
  });
  return `the module does not build: ${described.join("; ")}`;
}

/**
 * What the instance said before it died, as its last error line (the runtime's stderr), with
 * host paths removed; the provider's own message when there is none.
 */
function loadFailure(err: unknown): string {
  const texts: string[] = [];
  for (let cause: unknown = err; cause instanceof Error; cause = cause.cause) texts.push(cause.message);
  const lines = texts
    .join("\n")
    .split("\n")
    .map((line) => line.trim());
  const thrown = lines.filter((line) => /^(\w*Error|Uncaught|Error)\b.*:/.test(line) || /^\w+Error$/.test(line)).at(-1);
  const line = thrown ?? lines.find((l) => l.length > 0) ?? "the instance did not start";
  return withoutPaths(line);
}

/** Replaces file paths and URLs with `<module>`: an answer never shows the host's layout. */
export function withoutPaths(text: string): string {
  return text.replace(/(file:\/\/)?\/[^\s:'"()]+/g, "<module>").slice(0, 500);
}

function methodsOf(handle: MicrovmHandle): Promise<MethodDescription[]> {
  const upstream = upstreamOf(handle, RUNTIME_PORT);
  if (!upstream) return Promise.reject(new Error("the checked instance has no runtime port"));
  const target =
    "socketPath" in upstream ? { socketPath: upstream.socketPath } : { host: upstream.host, port: upstream.port };
  return new Promise((resolve, reject) => {
    const req = request(
      { ...target, path: RPC_HEALTH_PATH, method: "GET", headers: { ...handle.upstreamHeaders }, timeout: 10_000 },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => {
          try {
            const body = JSON.parse(text) as { methods?: MethodDescription[] };
            if (res.statusCode !== 200 || !Array.isArray(body.methods))
              throw new Error(`readiness probe answered ${res.statusCode}`);
            resolve(body.methods);
          } catch (err) {
            reject(err);
          }
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("readiness probe timed out")));
    req.on("error", reject);
    req.end();
  });
}

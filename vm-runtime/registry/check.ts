// Checking a module before it becomes an image, never by building, parsing or loading it on
// the host: it is started in a sandboxed instance of this host's provider (whose runtime
// refuses imports other than node builtins), asked for its methods, and terminated; every
// answer of the instance is read with a size and a time bound. An instance the host could not
// start is the host's failure (5xx), never the module's.
import { randomUUID } from "node:crypto";
import { request } from "node:http";
import { InternalServerError, InvalidImage, MAX_IMAGE_MODULE_BYTES, ServiceUnavailable } from "../../schemas/index.ts";
import { errorLineOf, withoutPaths } from "../host/start-failure.ts";
import {
  hostFailureOf,
  imageTimedOut,
  upstreamOf,
  RUNTIME_PORT,
  type MicrovmHandle,
  type MicrovmProvider,
} from "../host/provider.ts";
import { RPC_HEALTH_PATH } from "../wire/rpc.ts";
import type { MethodDescription } from "../runtime/server.ts";

/** Fails with a 400 `InvalidImage` when the module is larger than the limit. */
export function checkModuleSize(module: Uint8Array): void {
  if (module.byteLength <= MAX_IMAGE_MODULE_BYTES) return;
  throw InvalidImage.make({
    message: `the module is ${module.byteLength} bytes; the limit is ${MAX_IMAGE_MODULE_BYTES} bytes (4 MiB)`,
  });
}

/**
 * How long the module has to load and answer the readiness probe, counted from its runtime's
 * boot (the host's own time to boot one is bounded by the provider's start timeout, and a host
 * too slow is a 503, never the module's fault); and again for its methods answer.
 */
export const IMAGE_CHECK_TIMEOUT_MS = 8_000;
/** Largest methods answer read from a checked instance. */
export const METHODS_ANSWER_MAX_BYTES = 1024 * 1024;

/**
 * Starts the module at `path` (written by the caller) in an instance and resolves with its
 * methods; a module that does not load or define an image (its imports are checked inside the
 * instance), or does not answer within `timeoutMs`, is a 400 `InvalidImage`. Nothing of the
 * module is parsed or followed here: its answer is read with a size and a time bound. An
 * instance whose wall or runtime never came up is a 500 (503 when it only came up too slowly).
 */
export async function checkImageModule(
  path: string,
  provider: MicrovmProvider,
  timeoutMs = IMAGE_CHECK_TIMEOUT_MS,
): Promise<MethodDescription[]> {
  let handle: MicrovmHandle;
  try {
    handle = await provider.start({ microvmId: `image-check-${randomUUID()}`, image: path, imageTimeoutMs: timeoutMs });
  } catch (err) {
    // Logged with its cause where the host's provider is made (provider.ts).
    const host = hostFailureOf(err);
    if (host) throw (host.timedOut ? ServiceUnavailable : InternalServerError).make({}, { cause: err });
    const why = imageTimedOut(err)
      ? `it did not answer its readiness probe within ${timeoutMs / 1000} s`
      : loadFailure(err);
    const output = instanceOutput(err);
    throw InvalidImage.make(
      { message: `the module does not load as an image: ${why}`, ...(output.length > 0 ? { output } : {}) },
      { cause: err },
    );
  }
  const answerBy = AbortSignal.timeout(timeoutMs);
  try {
    return await methodsOf(handle, answerBy);
  } catch (err) {
    const why = answerBy.aborted
      ? `its methods answer did not end within ${timeoutMs / 1000} s`
      : withoutPaths((err as Error).message);
    throw InvalidImage.make({ message: `the module does not answer as an image: ${why}` }, { cause: err });
  } finally {
    await provider.terminate(handle, 500).catch(() => undefined);
  }
}

/**
 * What the instance said before it died, as its last error line (the runtime's stderr), with
 * host paths removed and, for a SyntaxError, node's line:column of it; the runtime's own
 * `ImageError:` line (a refused import, quoted from the module) as it is. The provider's
 * message when there is none.
 */
function loadFailure(err: unknown): string {
  const texts: string[] = [];
  for (let cause: unknown = err; cause instanceof Error; cause = cause.cause) texts.push(cause.message);
  const raw = texts.join("\n").split("\n");
  const line = errorLineOf(raw);
  if (line === undefined)
    return withoutPaths(raw.find((l) => l.trim().length > 0)?.trim() ?? "the instance did not start");
  return line.startsWith("SyntaxError") ? line + sourcePosition(raw) : line;
}

/** What the provider's start failure quotes of the instance's stderr (its last lines), paths replaced. */
const EXITED = /^instance exited (\([^)]*\) )?before it was ready:\n/;

/**
 * The instance's own last stderr lines, as the provider's start failure quotes them (at most 20,
 * each at most 500 characters, file paths replaced by `<module>`): empty when it quotes none.
 */
function instanceOutput(err: unknown): string[] {
  for (let cause: unknown = err; cause instanceof Error; cause = cause.cause) {
    if (!EXITED.test(cause.message)) continue;
    const lines = cause.message.replace(EXITED, "").split("\n");
    return lines
      .filter((line) => line.trim().length > 0)
      .slice(-20)
      .map(withoutPaths);
  }
  return [];
}

/**
 * ` (line L:C)` from node's report of an uncaught error: `<file>:<line>`, the source line, a
 * caret under the column (the column only while the lines were short enough to keep whole).
 */
function sourcePosition(lines: readonly string[]): string {
  const at = lines.findLastIndex((line) => /^(file:\/\/)?\/\S*:\d+$/.test(line.trim()));
  if (at === -1) return "";
  const line = /:(\d+)$/.exec(lines[at]!.trim())![1];
  // Spaces without a caret when the error has no width (the end of the input).
  const caret = /^( *)\^*$/.exec(lines[at + 2] ?? "");
  return caret ? ` (line ${line}:${caret[1]!.length + 1})` : ` (line ${line})`;
}

/**
 * The methods the runtime's readiness probe lists: the answer is read up to
 * `METHODS_ANSWER_MAX_BYTES` and until `deadline`; either ends the request.
 */
function methodsOf(handle: MicrovmHandle, deadline: AbortSignal): Promise<MethodDescription[]> {
  const upstream = upstreamOf(handle, RUNTIME_PORT);
  if (!upstream) return Promise.reject(new Error("the checked instance has no runtime port"));
  const target =
    "socketPath" in upstream ? { socketPath: upstream.socketPath } : { host: upstream.host, port: upstream.port };
  return new Promise((resolve, reject) => {
    const req = request(
      { ...target, path: RPC_HEALTH_PATH, method: "GET", headers: { ...handle.upstreamHeaders }, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        let bytes = 0;
        res.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          if (bytes > METHODS_ANSWER_MAX_BYTES)
            return req.destroy(new Error(`its methods answer is over ${METHODS_ANSWER_MAX_BYTES} bytes`));
          chunks.push(chunk);
        });
        res.on("error", reject);
        res.on("end", () => {
          try {
            if (res.statusCode !== 200) throw new Error(`its readiness probe answered ${res.statusCode}`);
            const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { methods?: MethodDescription[] };
            if (!Array.isArray(body.methods)) throw new Error("its readiness probe listed no methods");
            resolve(body.methods);
          } catch (err) {
            reject(err);
          }
        });
      },
    );
    const onDeadline = () => req.destroy(new Error("its methods answer did not end in time"));
    if (deadline.aborted) onDeadline();
    else deadline.addEventListener("abort", onDeadline, { once: true });
    req.on("close", () => deadline.removeEventListener("abort", onDeadline));
    req.on("error", reject);
    req.end();
  });
}

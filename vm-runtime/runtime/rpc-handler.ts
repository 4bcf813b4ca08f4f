// Serves `POST /__rpc__/<method>`: decodes the positional-argument array, validates it,
// calls the image's handler and answers JSON, an NDJSON stream, or an error envelope.
// Validators are compiled on a method's first call or by `prepare()`, whichever comes first:
// an instance boots without loading Ajv (~100 ms of load and first compile).
import type { Ajv, ErrorObject, ValidateFunction } from "ajv";
import type { IncomingMessage, ServerResponse } from "node:http";
import { argumentsSchema, type Image, type MethodDefinition } from "../image.ts";
import { BodyTooLargeError, readBody, sendJson } from "../wire/http-util.ts";
import { declaredStatus, encodeThrown, errorEnvelope, toJson, type RpcErrorBody } from "../wire/rpc.ts";
import { streamNdjson } from "./rpc-stream.ts";

/** How the runtime reports failures it answers as 500 (never sent to the caller). */
export type RuntimeLog = (message: string, cause?: unknown) => void;

export interface RpcHandlerOptions {
  readonly bodyLimitBytes: number;
  readonly log: RuntimeLog;
  /** Calls a method's handler (an object's gets its context first); default: with the arguments alone. */
  readonly invoke?: (definition: MethodDefinition, args: unknown[]) => unknown;
}

/** One argument-validation issue: where in the argument array, and what is wrong. */
export interface RpcIssue {
  readonly path: ReadonlyArray<string | number>;
  readonly message: string;
  readonly keyword: string;
}

interface CompiledMethod {
  readonly definition: MethodDefinition;
  readonly validateArgs?: ValidateFunction;
  readonly validateResult?: ValidateFunction;
}

/** A method whose validators are compiled once, when it is first called. */
interface LazyMethod {
  readonly definition: MethodDefinition;
  compiled?: CompiledMethod;
  compiling?: Promise<CompiledMethod>;
}

/** Handles a request whose path starts with the RPC prefix; `encodedName` is the rest of it. */
export interface RpcHandler {
  (req: IncomingMessage, res: ServerResponse, encodedName: string): Promise<void>;
  /** Compiles every method's validators, yielding between methods; never rejects. */
  prepare(): Promise<void>;
}

export function createRpcHandler(image: Image, options: RpcHandlerOptions): RpcHandler {
  const methods = compileMethods(image);
  const compiled = (lazy: LazyMethod) =>
    lazy.compiled ?? (lazy.compiling ??= compileMethod(lazy.definition).then((c) => (lazy.compiled = c)));
  const prepare = async () => {
    for (const [name, lazy] of Object.entries(methods)) {
      // A bad schema is reported here and answers its method's calls with a 500.
      await Promise.resolve(compiled(lazy)).catch((error: unknown) => {
        options.log(`schemas of method "${name}" do not compile`, error);
      });
      await new Promise((resolve) => setImmediate(resolve));
    }
  };
  return Object.assign(handleRpc, { prepare });

  async function handleRpc(req: IncomingMessage, res: ServerResponse, encodedName: string): Promise<void> {
    if (req.method !== "POST") {
      return fail(res, 405, { _tag: "RpcMethodNotAllowed", message: "RPC calls must use POST" }, { allow: "POST" });
    }
    let name: string;
    try {
      name = decodeURIComponent(encodedName);
    } catch {
      return fail(res, 400, { _tag: "RpcBadRequest", message: "method name is not valid percent-encoding" });
    }
    const lazy = Object.hasOwn(methods, name) ? methods[name] : undefined;
    if (!lazy) return fail(res, 404, { _tag: "RpcMethodNotFound", method: name, message: `no method "${name}"` });
    const method = await compiled(lazy);
    const args = await readArguments(req, res, options.bodyLimitBytes);
    if (!args) return;
    if (method.validateArgs && !method.validateArgs(args)) {
      const issues = toIssues(method.validateArgs.errors ?? []);
      return fail(res, 400, {
        _tag: "RpcInvalidArguments",
        issues,
        message: "arguments do not match the method's schema",
      });
    }
    await invoke(method, args, req, res, options);
  }
}

function compileMethods(image: Image): Record<string, LazyMethod> {
  const methods: Record<string, LazyMethod> = Object.create(null);
  for (const [name, definition] of Object.entries(image.methods)) methods[name] = { definition };
  return methods;
}

let sharedAjv: Promise<Ajv> | undefined;

/** Ajv loaded on first use (a dynamic import stays lazy in the esbuild bundle too). */
function loadAjv(): Promise<Ajv> {
  return (sharedAjv ??= import("ajv").then(({ Ajv }) => new Ajv({ allErrors: true, strict: false })));
}

async function compileMethod(definition: MethodDefinition): Promise<CompiledMethod> {
  const argsSchema = argumentsSchema(definition);
  if (argsSchema === undefined && definition.result === undefined) return { definition };
  const ajv = await loadAjv();
  return {
    definition,
    ...(argsSchema === undefined ? {} : { validateArgs: ajv.compile(argsSchema) }),
    ...(definition.result === undefined ? {} : { validateResult: ajv.compile(definition.result) }),
  };
}

async function readArguments(req: IncomingMessage, res: ServerResponse, limit: number): Promise<unknown[] | undefined> {
  let body: Buffer;
  try {
    body = await readBody(req, limit);
  } catch (error) {
    if (error instanceof BodyTooLargeError) {
      fail(
        res,
        413,
        { _tag: "RpcPayloadTooLarge", limitBytes: limit, message: error.message },
        { connection: "close" },
      );
    } else {
      res.destroy();
    }
    return undefined;
  }
  const text = body.toString("utf8");
  if (text.trim() === "") return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    fail(res, 400, { _tag: "RpcBadRequest", message: "body is not valid JSON" });
    return undefined;
  }
  if (!Array.isArray(parsed)) {
    fail(res, 400, { _tag: "RpcBadRequest", message: "body must be a JSON array of positional arguments" });
    return undefined;
  }
  return parsed;
}

async function invoke(
  method: CompiledMethod,
  args: unknown[],
  req: IncomingMessage,
  res: ServerResponse,
  { log, invoke: call }: RpcHandlerOptions,
): Promise<void> {
  let result: unknown;
  try {
    result = await (call ? call(method.definition, args) : method.definition.handler(...args));
  } catch (thrown) {
    return fail(res, declaredStatus(thrown), encodeThrown(thrown));
  }
  if (isAsyncIterable(result)) return streamNdjson(req, res, result);
  if (method.validateResult && !method.validateResult(result === undefined ? null : result)) {
    log("method result does not match its schema", toIssues(method.validateResult.errors ?? []));
    return fail(res, 500, { _tag: "RpcInvalidResult", message: "the method's result does not match its schema" });
  }
  let text: string;
  try {
    text = toJson(result);
  } catch (error) {
    log("method result is not JSON-encodable", error);
    return fail(res, 500, { _tag: "RpcEncodeError", message: "the method's result is not JSON-encodable" });
  }
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

function fail(res: ServerResponse, status: number, error: RpcErrorBody, headers: Record<string, string> = {}): void {
  sendJson(res, status, errorEnvelope(error), headers);
}

function isAsyncIterable(value: unknown): value is AsyncIterable<unknown> {
  return (
    typeof value === "object" &&
    value !== null &&
    typeof (value as { [Symbol.asyncIterator]?: unknown })[Symbol.asyncIterator] === "function"
  );
}

/** Ajv errors as issues whose path indexes the argument array (`[0, "name"]`). */
export function toIssues(errors: readonly ErrorObject[]): RpcIssue[] {
  return errors.map((error) => {
    const path: Array<string | number> = error.instancePath
      .split("/")
      .slice(1)
      .map((part) => part.replace(/~1/g, "/").replace(/~0/g, "~"))
      .map((part) => (/^\d+$/.test(part) ? Number(part) : part));
    const missing = (error.params as { missingProperty?: unknown }).missingProperty;
    if (error.keyword === "required" && typeof missing === "string") path.push(missing);
    return { path, message: error.message ?? "is invalid", keyword: error.keyword };
  });
}

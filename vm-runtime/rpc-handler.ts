// Serves `POST /__rpc__/<method>`: decodes the positional-argument array, validates it,
// calls the image's handler and answers JSON, an NDJSON stream, or an error envelope.
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import type { IncomingMessage, ServerResponse } from "node:http";
import { argumentsSchema, type Image, type MethodDefinition } from "./image.ts";
import { BodyTooLargeError, readBody, sendJson } from "./http-util.ts";
import {
  declaredStatus,
  encodeThrown,
  errorEnvelope,
  toJson,
  type RpcErrorBody,
} from "./rpc-wire.ts";
import { streamNdjson } from "./rpc-stream.ts";

/** How the runtime reports failures it answers as 500 (never sent to the caller). */
export type RuntimeLog = (message: string, cause?: unknown) => void;

export interface RpcHandlerOptions {
  readonly bodyLimitBytes: number;
  readonly log: RuntimeLog;
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

/** Handles a request whose path starts with the RPC prefix; `encodedName` is the rest of it. */
export type RpcHandler = (req: IncomingMessage, res: ServerResponse, encodedName: string) => Promise<void>;

export function createRpcHandler(image: Image, options: RpcHandlerOptions): RpcHandler {
  const methods = compileMethods(image);
  return async function handleRpc(req, res, encodedName) {
    if (req.method !== "POST") {
      return fail(res, 405, { _tag: "RpcMethodNotAllowed", message: "RPC calls must use POST" }, { allow: "POST" });
    }
    let name: string;
    try {
      name = decodeURIComponent(encodedName);
    } catch {
      return fail(res, 400, { _tag: "RpcBadRequest", message: "method name is not valid percent-encoding" });
    }
    const method = methods.get(name);
    if (!method) return fail(res, 404, { _tag: "RpcMethodNotFound", method: name, message: `no method "${name}"` });
    const args = await readArguments(req, res, options.bodyLimitBytes);
    if (!args) return;
    if (method.validateArgs && !method.validateArgs(args)) {
      const issues = toIssues(method.validateArgs.errors ?? []);
      return fail(res, 400, { _tag: "RpcInvalidArguments", issues, message: "arguments do not match the method's schema" });
    }
    await invoke(method, args, req, res, options.log);
  };
}

function compileMethods(image: Image): Map<string, CompiledMethod> {
  const ajv = new Ajv({ allErrors: true, strict: false });
  const methods = new Map<string, CompiledMethod>();
  for (const [name, definition] of Object.entries(image.methods)) {
    const argsSchema = argumentsSchema(definition);
    methods.set(name, {
      definition,
      ...(argsSchema === undefined ? {} : { validateArgs: ajv.compile(argsSchema) }),
      ...(definition.result === undefined ? {} : { validateResult: ajv.compile(definition.result) }),
    });
  }
  return methods;
}

async function readArguments(req: IncomingMessage, res: ServerResponse, limit: number): Promise<unknown[] | undefined> {
  let body: Buffer;
  try {
    body = await readBody(req, limit);
  } catch (error) {
    if (error instanceof BodyTooLargeError) {
      fail(res, 413, { _tag: "RpcPayloadTooLarge", limitBytes: limit, message: error.message }, { connection: "close" });
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
  log: RuntimeLog,
): Promise<void> {
  let result: unknown;
  try {
    result = await method.definition.handler(...args);
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

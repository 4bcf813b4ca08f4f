// Image definition: a set of named RPC methods (optionally schema-checked) plus a fetch
// handler for every other request. The image's type is what a client derives its stub from.
import type { Static, TSchema, TTuple } from "@sinclair/typebox";

/** A JSON Schema (TypeBox schemas are JSON Schemas too). */
export type JsonSchema = Record<string, unknown> | boolean;

/** The handler every non-RPC request goes to. */
export type FetchHandler = (request: Request) => Response | Promise<Response>;

/** One RPC method of an image. */
export interface MethodDefinition<A extends readonly unknown[] = any[], R = unknown> {
  /** Called with the positional arguments of the request body. */
  readonly handler: (...args: A) => R;
  /** Argument schemas: a tuple schema (e.g. TypeBox `Type.Tuple`) or one schema per position. */
  readonly args?: TTuple | readonly JsonSchema[];
  /** Schema of a non-streamed result; a handler returning something else answers 500. */
  readonly result?: JsonSchema;
}

/** Named methods of an image. */
export type MethodMap = { readonly [name: string]: MethodDefinition<any, any> };

/** A defined image: what an image module exports as `default`. */
export interface Image<M extends MethodMap = MethodMap> {
  readonly kind: typeof IMAGE_KIND;
  readonly methods: M;
  readonly fetch: FetchHandler;
}

/** What an image is declared from. */
export interface ImageDefinition<M extends MethodMap> {
  readonly methods: M;
  /** Everything that is not RPC; defaults to a plain-text 404. */
  readonly fetch?: FetchHandler;
}

/** JSON turns `undefined` into `null` on the wire. */
type OnTheWire<T> = [T] extends [undefined | void] ? null : T;

/** What a remote call resolves to: an async iterable for a streamed method, else the JSON value. */
export type RemoteResult<R> =
  Awaited<R> extends AsyncIterable<infer T> ? AsyncIterable<OnTheWire<T>> : OnTheWire<Awaited<R>>;

/** The client-side shape of an image: every method becomes async. */
export type ImageShape<I> =
  I extends Image<infer M>
    ? {
        [K in keyof M & string]: M[K] extends MethodDefinition<infer A, infer R>
          ? (...args: A) => Promise<RemoteResult<R>>
          : never;
      }
    : never;

export const IMAGE_KIND = "typed-service/microvm-image";

/** Names that exist on every object: never callable, so `constructor` & co. answer 404. */
const INHERITED_NAMES = new Set(Object.getOwnPropertyNames(Object.prototype));

const notFound: FetchHandler = () =>
  new Response("Not Found\n", { status: 404, headers: { "content-type": "text/plain; charset=utf-8" } });

/** Declares an image; throws on a method name that every object inherits. */
export function defineImage<const M extends MethodMap>(definition: ImageDefinition<M>): Image<M> {
  for (const name of Object.keys(definition.methods)) {
    if (INHERITED_NAMES.has(name)) throw new TypeError(`image method name "${name}" is reserved`);
    const candidate = definition.methods[name];
    if (typeof candidate?.handler !== "function") throw new TypeError(`image method "${name}" has no handler`);
  }
  return Object.freeze({ kind: IMAGE_KIND, methods: definition.methods, fetch: definition.fetch ?? notFound });
}

/** Declares a method whose handler's parameter types come from a TypeBox tuple schema. */
export function method<const S extends TTuple, R>(definition: {
  readonly args: S;
  readonly result?: TSchema;
  readonly handler: (...args: Static<S> & unknown[]) => R;
}): MethodDefinition<Static<S> & unknown[], R> {
  return definition;
}

/** True for a value that looks like a defined image (e.g. a module's default export). */
export function isImage(value: unknown): value is Image {
  return typeof value === "object" && value !== null && (value as { kind?: unknown }).kind === IMAGE_KIND;
}

/** The single tuple schema that validates a method's argument array, if it declares one. */
export function argumentsSchema(definition: MethodDefinition): JsonSchema | undefined {
  const { args } = definition;
  if (args === undefined) return undefined;
  if (!Array.isArray(args)) return args as JsonSchema;
  return { type: "array", items: [...args], minItems: args.length, maxItems: args.length };
}

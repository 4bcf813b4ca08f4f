// Object definition: an image whose methods get a context first (the object's name, its durable
// storage, its alarm) and which has at most one activation per name. The result is an Image, so
// the registry, bundling and runtime take it as one; the runtime serves it in object mode.
import type { TTuple } from "@sinclair/typebox";
import { defineImage, type Image, type JsonSchema, type RemoteResult } from "./image.ts";
import type { ObjectTraits } from "./objects/types.ts";

/** One stored key and its value. */
export interface StoredEntry {
  readonly key: string;
  readonly value: unknown;
}

/** A page of stored entries, in the order they were last written; `cursor` when more may follow. */
export type StoredList = StoredEntry[] & { readonly cursor?: string };

export interface StoredListOptions {
  /** Only keys starting with this. */
  readonly prefix?: string;
  /** Entries at most (default 100, at most 1000). */
  readonly limit?: number;
  /** The `cursor` of the previous page. */
  readonly cursor?: string;
}

/**
 * `ctx.storage`: JSON values (≤ 128 KiB as JSON) under string keys (≤ 512 bytes), durable once a
 * write resolves. A refused call throws an Error with a `_tag` and an HTTP `status` (uncaught, it
 * answers the call with them): StorageKeyInvalid, StorageValueInvalid, StorageQuotaExceeded,
 * ActivationSuperseded (another activation holds the object now), ObjectChannelClosed.
 */
export interface ObjectStorageApi {
  /** The key's value; undefined when none is stored. */
  get<T = unknown>(key: string): Promise<T | undefined>;
  put(key: string, value: unknown): Promise<void>;
  /** True when the key held a value. */
  delete(key: string): Promise<boolean>;
  list(options?: StoredListOptions): Promise<StoredList>;
}

/** What every method and the alarm of an object get first. */
export interface ObjectContext {
  /** The object's name (the one the caller addressed). */
  readonly name: string;
  readonly storage: ObjectStorageApi;
  /** Sets (or moves) the object's one alarm; resolves with the epoch ms it fires at. */
  setAlarm(epochMs: number): Promise<number>;
  /** Epoch ms the alarm fires at, or null when none is set. */
  getAlarm(): Promise<number | null>;
  deleteAlarm(): Promise<void>;
}

/** One method of an object: its handler gets the context, then the call's positional arguments. */
export interface ObjectMethodDefinition<A extends readonly unknown[] = any[], R = unknown> {
  readonly handler: (ctx: ObjectContext, ...args: A) => R;
  /** Argument schemas (the context excluded): a tuple schema or one schema per position. */
  readonly args?: TTuple | readonly JsonSchema[];
  /** Schema of the result; a handler returning something else answers 500. */
  readonly result?: JsonSchema;
}

/**
 * Named methods of an object. Arguments are `never` here, not `any`: a parameter with a default
 * (`(ctx, by = 1) =>`) then takes its type from the default instead of becoming `any`.
 */
export type ObjectMethodMap = { readonly [name: string]: ObjectMethodDefinition<never, unknown> };

/** The alarm handler: runs when the time set with `ctx.setAlarm` has come. */
export type AlarmHandler = (ctx: ObjectContext) => unknown;

/** What an object class is declared from. */
export interface ObjectDefinition<M extends ObjectMethodMap> {
  readonly methods: M;
  readonly alarm?: AlarmHandler;
  /** Seconds without calls before the activation is evicted: 1..86400 (default 60). */
  readonly idleSeconds?: number;
  /** "snapshot": the activation's memory is kept through the snapshot path when evicted (default "none"). */
  readonly hibernate?: "none" | "snapshot";
}

/** A defined object class: an image (its methods take the context first) marked as an object. */
export interface ObjectImage<M extends ObjectMethodMap = ObjectMethodMap> extends Image<M> {
  readonly object: ObjectTraits;
  readonly alarm?: AlarmHandler;
}

/** The client-side shape of an object: its methods without the context, each async. */
export type ObjectShape<I> =
  I extends ObjectImage<infer M>
    ? {
        [K in keyof M & string]: M[K] extends ObjectMethodDefinition<infer A, infer R>
          ? (...args: A) => Promise<RemoteResult<R>>
          : never;
      }
    : never;

export const DEFAULT_IDLE_SECONDS = 60;
export const MAX_IDLE_SECONDS = 86_400;

/** Declares an object class; throws on a bad method, idle time or hibernation mode. */
export function defineObject<const M extends ObjectMethodMap>(definition: ObjectDefinition<M>): ObjectImage<M> {
  const idleSeconds = definition.idleSeconds ?? DEFAULT_IDLE_SECONDS;
  if (!Number.isInteger(idleSeconds) || idleSeconds < 1 || idleSeconds > MAX_IDLE_SECONDS)
    throw new RangeError(`idleSeconds is a whole number of seconds, 1 to ${MAX_IDLE_SECONDS}; got ${idleSeconds}`);
  const hibernate = definition.hibernate ?? "none";
  if (hibernate !== "none" && hibernate !== "snapshot")
    throw new TypeError(`hibernate is "none" or "snapshot"; got ${JSON.stringify(hibernate)}`);
  const { alarm } = definition;
  if (alarm !== undefined && typeof alarm !== "function") throw new TypeError("an object's alarm is a function");
  const image = defineImage({ methods: definition.methods });
  const object: ObjectTraits = Object.freeze({ idleSeconds, hibernate, alarm: alarm !== undefined });
  return Object.freeze({ ...image, object, ...(alarm ? { alarm } : {}) });
}

/** True for a defined image that is an object class. */
export function isObjectImage(image: Image): image is ObjectImage {
  const object = (image as { object?: unknown }).object;
  return typeof object === "object" && object !== null;
}

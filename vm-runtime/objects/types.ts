// What the parts of objects agree on: the host's activations of objects (one per object in the
// cluster) as the operations' handlers call them, and the session a host holds with one running
// activation (calls in, storage and alarm requests out, over the runtime's socket).
import type { ObjectRef } from "./keys.ts";

/** An answer of an object's code, as the RPC wire carries it (§5 of the design). */
export interface ObjectAnswer {
  /** 200 with the JSON result; a thrown error non-2xx with the RPC error envelope. */
  readonly status: number;
  /** The answer's JSON body, unparsed (the host relays it as it is). */
  readonly body: Uint8Array;
}

/** What an object image declares besides its methods (from its readiness probe). */
export interface ObjectTraits {
  /** Seconds without calls before the activation is evicted. */
  readonly idleSeconds: number;
  readonly hibernate: "none" | "snapshot";
  /** The image has an `alarm` handler. */
  readonly alarm: boolean;
}

/** One object as the directory shows it. */
export interface ObjectItem {
  readonly image: string;
  readonly name: string;
  readonly active: boolean;
  /** The host its activation runs on, when active. */
  readonly activeOn?: string;
  readonly storageBytes: number;
  /** Epoch ms of the alarm set, if any. */
  readonly alarmAt?: number;
}

/** The objects of this cluster as one microVM host reaches them. */
export interface ObjectActivations {
  /**
   * Runs `method` on the object's one activation (activating it here, or relaying to the host
   * that holds it); calls to one object run one at a time in arrival order. Rejects with an
   * `ApiError`-shaped failure: ImageNotFound, NotAnObject, ObjectBusy,
   * ObjectLimitExceeded (the caller's most objects active on this host, each busy).
   */
  call(object: ObjectRef, method: string, args: unknown[], signal?: AbortSignal): Promise<ObjectAnswer>;
  /** Stops the object's activation wherever it runs (storage stays). */
  deactivate(object: ObjectRef): Promise<void>;
  /**
   * Deletes the object where it lives, in its mailbox (no call interleaves; those after it find
   * a new object): stops its activation, removes its snapshot, storage, alarm and directory record.
   */
  delete(object: ObjectRef): Promise<void>;
  /** Whether, and where, the object is active now. */
  activeOn(object: ObjectRef): Promise<string | undefined>;
  close(): Promise<void>;
}

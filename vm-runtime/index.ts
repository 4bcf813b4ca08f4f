// The image SDK: what an image author and a caller of an instance use, and nothing of the host
// (that is the microVM service's entry, service/index.ts). Image modules are bundled from it,
// so it holds only code that runs inside an instance or in a caller's process.
import type { ImageShape } from "./image.ts";
import type sandboxImage from "./images/sandbox.ts";

// Defining an image, and an object class (an image whose methods get a context first).
export { defineImage, method } from "./image.ts";
export { defineObject } from "./object.ts";
export type {
  AlarmHandler,
  ObjectContext,
  ObjectDefinition,
  ObjectImage,
  ObjectMethodDefinition,
  ObjectMethodMap,
  ObjectShape,
  ObjectStorageApi,
  StoredEntry,
  StoredList,
  StoredListOptions,
} from "./object.ts";
export type { ObjectTraits } from "./objects/types.ts";
export type {
  FetchHandler,
  Image,
  ImageDefinition,
  ImageShape,
  JsonSchema,
  MethodDefinition,
  MethodMap,
  RemoteResult,
} from "./image.ts";

// Calling an instance: the typed stub and the errors it rejects with.
export { connectImage, connectMicrovm, microvmConnection } from "./client/stub.ts";
export type { AnyShape, ConnectOptions, MicrovmConnection, MicrovmStub } from "./client/stub.ts";
export { isRpcError, MicrovmRpcError } from "./wire/rpc-error.ts";

// Calling an object: the typed stub of one object (its image and name) on the microVM API.
export { object, objectConnection } from "./client/object.ts";
export type { ObjectConnection, ObjectOptions } from "./client/object.ts";
export type { RpcFailureSource } from "./wire/rpc-error.ts";

// The wire: what an answer of the runtime carries, and the codes a `stateReason` starts with.
export type { RpcErrorBody, RpcErrorEnvelope, RpcStreamErrorLine } from "./wire/rpc.ts";
export type { RpcIssue } from "./runtime/rpc-handler.ts";
export type { MethodDescription } from "./runtime/server.ts";
export { StateReason } from "./wire/state-reasons.ts";
export type { StateReasonText } from "./wire/state-reasons.ts";

/** The client shape of the example `sandbox` image. */
export type SandboxShape = ImageShape<typeof sandboxImage>;
export type { CountInterrupted, Unlucky } from "./images/sandbox.ts";

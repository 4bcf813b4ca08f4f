// Object operation contracts (objects: user code with a name, one activation per caller, image
// and name): a call of a method, served over NATS (`objects.<op>`) and as REST under
// `/2025-09-09/objects` on the microVM API; list, get and delete read and clear the directory.
import { Type } from "@sinclair/typebox";
import { Count } from "./counts.ts";
import {
  ImageNotFound,
  NotAnObject,
  ObjectBusy,
  ObjectCallTimeout,
  ObjectLimitExceeded,
  ObjectNotFound,
  RpcFailure,
} from "./errors.ts";
import { ImageName } from "./images.ts";
import { LogPage, LogQuery, logWaitMs } from "./logs.ts";
import { stateless } from "./placement.ts";
import { NoContent } from "./replies.ts";
import type { Operation } from "./types.ts";

/** Longest object name, in characters. */
export const MAX_OBJECT_NAME_LENGTH = 256;
/** Objects of one list page: default and most. */
export const DEFAULT_OBJECT_PAGE = 100;
export const MAX_OBJECT_PAGE = 1000;

/** An object's name: 1-256 characters, any (URL-encoded in a path). */
export const ObjectName = Type.String({ minLength: 1, maxLength: MAX_OBJECT_NAME_LENGTH });

/** One object as the directory shows it. */
export const ObjectItem = Type.Object({
  image: Type.String(),
  name: Type.String(),
  active: Type.Boolean({ description: "an activation runs the object's code now" }),
  activeOn: Type.Optional(Type.String({ description: "the microVM host holding its activation, when active" })),
  storageBytes: Type.Integer({ minimum: 0, description: "bytes of its storage (keys and JSON values)" }),
  alarmAt: Type.Optional(Type.Integer({ description: "epoch ms its alarm is set to fire at, when one is set" })),
});

const ObjectParams = Type.Object({ image: ImageName, name: ObjectName }, { additionalProperties: false });

const base = "/2025-09-09/objects";

export const callObject = {
  name: "callObject",
  api: "microvm",
  http: { method: "POST", path: `${base}/:image/:name/rpc/:method` },
  subject: "objects.call",
  // Any host takes the call: the host's activations run it on the object's one activation.
  placement: stateless,
  params: Type.Object(
    { ...ObjectParams.properties, method: Type.String({ minLength: 1, maxLength: 256 }) },
    { additionalProperties: false },
  ),
  payload: Type.Object(
    {
      args: Type.Optional(
        Type.Array(Type.Unknown(), {
          default: [],
          description: "the method's positional arguments (over HTTP: the whole body; an empty body is [])",
        }),
      ),
    },
    { additionalProperties: false },
  ),
  body: "args",
  success: Type.Unknown({ description: "the method's result, as JSON (undefined is null)" }),
  errors: [ImageNotFound, NotAnObject, ObjectBusy, ObjectLimitExceeded, ObjectCallTimeout, RpcFailure],
  // An activation starts an instance first; the method may take its time.
  timeoutMs: 30_000,
  summary: "Call a method of an object (activating it); the answer is the RPC wire's, relayed",
} as const satisfies Operation;

export const listObjects = {
  name: "listObjects",
  api: "microvm",
  http: { method: "GET", path: base },
  subject: "objects.list",
  placement: stateless,
  query: Type.Object(
    {
      image: Type.Optional(ImageName),
      limit: Type.Optional(
        Count(MAX_OBJECT_PAGE, `objects per page, 1-${MAX_OBJECT_PAGE} (default ${DEFAULT_OBJECT_PAGE})`),
      ),
      cursor: Type.Optional(Type.String({ pattern: "^[0-9]{1,16}$", description: "the `cursor` of the page before" })),
    },
    { additionalProperties: false },
  ),
  success: Type.Object({
    items: Type.Array(ObjectItem),
    cursor: Type.Optional(Type.String({ description: "pass as `cursor` for the next page; absent on the last" })),
  }),
  errors: [],
  summary: "A page of your objects (of one image with `image`), in the order they were first used",
} as const satisfies Operation;

export const getObject = {
  name: "getObject",
  api: "microvm",
  http: { method: "GET", path: `${base}/:image/:name` },
  subject: "objects.get",
  placement: stateless,
  params: ObjectParams,
  success: ObjectItem,
  errors: [ObjectNotFound],
  summary: "Describe an object: whether and where it is active, its storage bytes, its alarm",
} as const satisfies Operation;

export const deleteObject = {
  name: "deleteObject",
  api: "microvm",
  http: { method: "DELETE", path: `${base}/:image/:name` },
  subject: "objects.delete",
  placement: stateless,
  params: ObjectParams,
  success: NoContent,
  errors: [ObjectNotFound],
  // Its storage is purged a page at a time.
  timeoutMs: 30_000,
  summary: "Delete an object: its activation stopped, its storage and alarm gone",
} as const satisfies Operation;

export const getObjectLogs = {
  name: "getObjectLogs",
  api: "microvm",
  http: { method: "GET", path: `${base}/:image/:name/logs` },
  subject: "objects.logs",
  placement: stateless,
  params: ObjectParams,
  query: LogQuery,
  success: LogPage,
  errors: [ObjectNotFound],
  waitMsOf: logWaitMs,
  follow: { items: "items", waitSeconds: 20 },
  summary:
    "Read what an object's code wrote (stdout and stderr, across its activations): the latest lines, or those after a cursor",
} as const satisfies Operation;

export const objectApi = { callObject, listObjects, getObject, deleteObject, getObjectLogs } as const;

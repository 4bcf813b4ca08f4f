// The object operations as handlers of one microVM host: a call runs on the object's one
// activation (wherever the host's activations find it) and its RPC answer is relayed as it is;
// list and get read the directory and describe each object; delete runs where the object lives
// (its activation lists it when it starts).
import {
  ObjectNotFound,
  RelayedAnswer,
  DEFAULT_OBJECT_PAGE,
  ServiceUnavailable,
  type objectApi,
} from "../../schemas/index.ts";
import type { ApiHandlers } from "../../actors/serve.ts";
import type { HeldRequests } from "../../platform/index.ts";
import { answerLogRead, type InstanceLogs } from "../service/logs.ts";
import { RPC_ERROR_TAG } from "../wire/rpc.ts";
import type { ObjectAlarms } from "./alarms.ts";
import type { ObjectDirectory } from "./directory.ts";
import { objectKey, objectLogId, type ObjectRef } from "./keys.ts";
import type { ObjectStores } from "./storage.ts";
import type { ObjectActivations, ObjectAnswer, ObjectItem } from "./types.ts";

/** What the object operations of a host use. */
export interface ObjectOperationDeps {
  readonly activations: ObjectActivations;
  readonly directory: ObjectDirectory;
  readonly stores: ObjectStores;
  readonly alarms: ObjectAlarms;
  /** Where the objects' output lines are stored and read. */
  readonly logs: Pick<InstanceLogs, "read" | "has">;
  /** Long polls of the logs, ended when the gateway says their client left. */
  readonly held: Pick<HeldRequests, "hold">;
}

export type ObjectHandlers = ApiHandlers<typeof objectApi>;

/** Bytes of an error answer read for its `_tag`, at most. */
const TAG_READ_BYTES = 64 * 1024;

export function objectHandlers(deps: ObjectOperationDeps): ObjectHandlers {
  const { activations, directory, stores, alarms } = deps;

  const describe = async (object: ObjectRef): Promise<ObjectItem> => {
    const [activeOn, storageBytes, alarmAt] = await Promise.all([
      activations.activeOn(object),
      stores.usage.objectBytes(objectKey(object)),
      alarms.get(object),
    ]);
    return {
      image: object.image,
      name: object.name,
      active: activeOn !== undefined,
      ...(activeOn === undefined ? {} : { activeOn }),
      storageBytes: Math.max(0, storageBytes),
      ...(alarmAt === null ? {} : { alarmAt }),
    };
  };

  const listed = async (object: ObjectRef): Promise<void> => {
    if (!(await directory.has(object))) throw ObjectNotFound.make({ image: object.image, name: object.name });
  };

  return {
    async callObject({ image, name, method, args }, { principal }) {
      // Its activation lists it before its code runs: an object that stores anything is listed.
      const answer = await activations.call({ principal, image, name }, method, args ?? []);
      return new RelayedAnswer(answer.status, answer.body, tagOf(answer));
    },
    async listObjects(input, { principal }) {
      const page = await directory.page(principal, {
        ...(input.image === undefined ? {} : { image: input.image }),
        limit: Number(input.limit ?? DEFAULT_OBJECT_PAGE),
        ...(input.cursor === undefined ? {} : { cursor: Number(input.cursor) }),
      });
      const items = await Promise.all(page.objects.map(describe));
      return page.cursor === undefined ? { items } : { items, cursor: page.cursor };
    },
    async getObject({ image, name }, { principal }) {
      const object = { principal, image, name };
      await listed(object);
      return describe(object);
    },
    /**
     * Where the object lives, in its mailbox: stops the activation, then removes its snapshot, the
     * storage a page at a time, the alarm and last the record: a delete cut short leaves the
     * object listed, and deleting it again goes on.
     */
    async deleteObject({ image, name }, { principal }) {
      const object = { principal, image, name };
      await listed(object);
      await activations.delete(object);
      return null;
    },
    /** The lines the object's activations wrote: any host reads them (they outlive each activation). */
    getObjectLogs(input, context) {
      const object = { principal: context.principal, image: input.image, name: input.name };
      const request = { owner: object.principal, id: objectLogId(object), headers: context.headers };
      // Another principal's object of that name is not the caller's: 404.
      return answerLogRead(deps.logs, deps.held, request, input, () => listed(object));
    },
  };
}

/** The `_tag` of an answer that is not a success (the RPC wire's envelope tag unless it says another). */
function tagOf(answer: ObjectAnswer): string {
  if (answer.status >= 200 && answer.status <= 299) return "";
  if (answer.body.length > TAG_READ_BYTES) return RPC_ERROR_TAG;
  try {
    const tag = (JSON.parse(Buffer.from(answer.body).toString("utf8")) as { _tag?: unknown } | null)?._tag;
    return typeof tag === "string" && tag !== "" ? tag : RPC_ERROR_TAG;
  } catch {
    return RPC_ERROR_TAG;
  }
}

/** Activations of a host that runs none: a call is a 503 (no object is ever active here). */
export const noActivations: ObjectActivations = {
  call: () => Promise.reject(ServiceUnavailable.make({ message: "this host does not run objects" })),
  delete: () => Promise.reject(ServiceUnavailable.make({ message: "this host does not run objects" })),
  deactivate: () => Promise.resolve(),
  activeOn: () => Promise.resolve(undefined),
  close: () => Promise.resolve(),
};

// The directory of objects: one record per object in the objects bucket, under its own key
// (`=d.<object-key>`: no lease key `<p>.<i>.<n>` nor storage key `<p>.<i>.<n>.<k>` starts with
// `=`), written where an activation of the object starts (the record is created if missing) and
// purged when the object is deleted. A list reads one page of a principal's records (of one
// image) in one request, whatever the bucket holds.
import { headers } from "@nats-io/transport-node";
import { isWrongLastSequence, JetStreamRequestError, OBJECTS_BUCKET, type Requester } from "../../platform/index.ts";
import { nameToken } from "../../schemas/index.ts";
import { bucketSubject, objectKey, objectOfKey, type ObjectRef } from "./keys.ts";
import { readPage } from "./pages.ts";

/** The first token of every directory key (`=`: in no base64url token). */
const DIRECTORY_MARK = "=d";
const STREAM = `KV_${OBJECTS_BUCKET}`;

/** The bucket key of `object`'s directory record. */
export const directoryKey = (object: ObjectRef): string => `${DIRECTORY_MARK}.${objectKey(object)}`;

/** A page of a principal's objects, in the order they were first called; `cursor` when more may follow. */
export interface DirectoryPage {
  readonly objects: ObjectRef[];
  readonly cursor?: string;
}

export interface PageRequest {
  /** Only this image's objects. */
  readonly image?: string;
  readonly limit: number;
  /** Where the page before ended (a stream sequence). */
  readonly cursor?: number;
}

export interface ObjectDirectory {
  /** Lists `object`, unless it is listed already (one request either way). */
  enter(object: ObjectRef): Promise<void>;
  /** True when `object` is listed. */
  has(object: ObjectRef): Promise<boolean>;
  /** One page of `principal`'s objects, in one request. */
  page(principal: string, request: PageRequest): Promise<DirectoryPage>;
  /** Removes `object`'s record (a deleted object is listed again by its next activation). */
  remove(object: ObjectRef): Promise<void>;
}

export interface DirectoryOptions {
  timeoutMs?: number;
}

interface JsReply {
  error?: { code: number; err_code: number; description: string };
}

export function objectDirectory(requester: Requester, options: DirectoryOptions = {}): ObjectDirectory {
  const timeout = options.timeoutMs ?? 5_000;
  const failed = (reply: JsReply) => {
    if (reply.error) throw new JetStreamRequestError(reply.error.code, reply.error.err_code, reply.error.description);
  };

  return {
    async enter(object) {
      const key = directoryKey(object);
      const h = headers();
      // A create: written only when the key has no message yet.
      h.set("Nats-Expected-Last-Subject-Sequence", "0");
      const record = JSON.stringify({ createdAt: new Date().toISOString() });
      const reply = (await requester.request(bucketSubject(key), record, timeout, h)).json<JsReply>();
      // Refused as listed already: the record stays as it was first written.
      if (!isWrongLastSequence(reply.error?.err_code)) failed(reply);
    },
    async has(object) {
      const key = directoryKey(object);
      const page = await readPage(requester, STREAM, bucketSubject(key), 0, 1, timeout);
      return page.messages.some((m) => !m.deleted);
    },
    async page(principal, request) {
      const filter = request.image
        ? `${bucketSubject(DIRECTORY_MARK)}.${nameToken(principal)}.${nameToken(request.image)}.*`
        : `${bucketSubject(DIRECTORY_MARK)}.${nameToken(principal)}.>`;
      const page = await readPage(requester, STREAM, filter, request.cursor ?? 0, request.limit, timeout);
      const prefix = `${bucketSubject(DIRECTORY_MARK)}.`;
      const objects: ObjectRef[] = [];
      for (const message of page.messages) {
        const object = message.deleted ? undefined : objectOfKey(message.subject.slice(prefix.length));
        if (object) objects.push(object);
      }
      const last = page.messages.at(-1)?.seq;
      return page.pending > 0 && last !== undefined ? { objects, cursor: String(last) } : { objects };
    },
    async remove(object) {
      const key = directoryKey(object);
      const reply = await requester.request(
        `$JS.API.STREAM.PURGE.${STREAM}`,
        JSON.stringify({ filter: bucketSubject(key) }),
        timeout,
      );
      failed(reply.json<JsReply>());
    },
  };
}

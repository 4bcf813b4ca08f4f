// The host's half of the object channel: serves the requests an instance's runtime writes (its
// object's storage and alarm) with the activation's fenced storage. The instance is hostile:
// lines are bounded, requests in flight are bounded (more are answered with an error), answers
// stop being read for while the runtime does not read them, and garbage closes the channel.
import type { Socket } from "node:net";
import type { ObjectAlarms } from "./alarms.ts";
import { ObjectError } from "./errors.ts";
import type { ObjectRef } from "./keys.ts";
import type { ListOptions, ObjectStorage } from "./storage.ts";
import {
  lineReader,
  MAX_IN_FLIGHT,
  MAX_REQUEST_LINE_BYTES,
  type ChannelAnswer,
  type ChannelError,
  type ChannelRequest,
} from "./channel.ts";

/** How the host reports a failure it answered as unavailable, or a channel it closed (never to the instance). */
export type SessionLog = (message: string, cause?: unknown) => void;

export interface ChannelServing {
  readonly object: ObjectRef;
  readonly storage: ObjectStorage;
  readonly alarms: ObjectAlarms;
  /** Called once, on the first write refused as ActivationSuperseded. */
  readonly onSuperseded?: (err: ObjectError) => void;
  readonly log: SessionLog;
  /** Requests served at once (default `MAX_IN_FLIGHT`). */
  readonly inFlight?: number;
  /** Longest request line (default `MAX_REQUEST_LINE_BYTES`). */
  readonly lineBytes?: number;
}

/** Answers queued for a runtime that does not read before the host stops reading its requests. */
const ANSWER_HIGH_WATER_BYTES = 1024 * 1024;

/** Serves the channel on `socket` (`head`: bytes read past the Upgrade) until it closes. */
export function serveChannel(socket: Socket, head: Buffer, serving: ChannelServing): Promise<void> {
  const limit = serving.inFlight ?? MAX_IN_FLIGHT;
  let inFlight = 0;
  let superseded = false;
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  const drop = (why: string) => {
    serving.log(`closed the object channel of ${serving.object.name}: ${why}`);
    socket.destroy();
  };
  const answer = (reply: ChannelAnswer) => {
    if (socket.destroyed) return;
    socket.write(`${JSON.stringify(reply)}\n`);
    if (socket.writableLength > ANSWER_HIGH_WATER_BYTES && !socket.isPaused()) {
      socket.pause();
      socket.once("drain", () => socket.resume());
    }
  };
  const failed = (err: unknown): ChannelError => {
    if (!(err instanceof ObjectError)) {
      serving.log(`a storage request of ${serving.object.name} failed`, err);
      return { _tag: "ObjectStorageUnavailable", message: "the object's storage did not answer", status: 503 };
    }
    if (err._tag === "ActivationSuperseded" && !superseded) {
      superseded = true;
      serving.onSuperseded?.(err);
    }
    return { _tag: err._tag, message: err.message, status: err.status };
  };
  const onLine = (line: string) => {
    if (socket.destroyed) return;
    const request = parseLine(line);
    if (request === undefined) return drop("a line that is not a request");
    if (inFlight >= limit) return answer({ id: request.id, ok: false, error: channelBusy(limit) });
    inFlight++;
    perform(request, serving)
      .then(
        (value) => answer({ id: request.id, ok: true, value }),
        (err: unknown) => answer({ id: request.id, ok: false, error: failed(err) }),
      )
      .catch((err: unknown) => serving.log("answering a storage request failed", err))
      .finally(() => inFlight--);
  };
  const read = lineReader(serving.lineBytes ?? MAX_REQUEST_LINE_BYTES, onLine, () => drop("a line over the limit"));
  socket.on("data", read);
  socket.on("error", () => socket.destroy());
  socket.once("end", () => socket.destroy());
  if (head.length > 0) read(head);
  return closed;
}

const channelBusy = (limit: number): ChannelError => ({
  _tag: "ObjectChannelBusy",
  message: `the object has ${limit} storage requests in flight, its most`,
  status: 429,
});

/** A request's id and op, its fields unchecked; undefined for a line that is not one. */
function parseLine(line: string): { id: number; op: unknown; [field: string]: unknown } | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return undefined;
  const { id } = parsed as { id?: unknown };
  return Number.isSafeInteger(id) && (id as number) >= 0 ? (parsed as { id: number; op: unknown }) : undefined;
}

const invalid = (message: string) => new ObjectError("ObjectChannelInvalid", 400, message);

const optional = (value: unknown, type: "string" | "number", field: string) => {
  if (value !== undefined && typeof value !== type) throw invalid(`"${field}" must be a ${type}`);
  return value;
};

/** Runs one request; rejects with an ObjectError for a request that is not one of the channel's. */
async function perform(request: { op: unknown; [field: string]: unknown }, serving: ChannelServing): Promise<unknown> {
  const { storage, alarms, object } = serving;
  const key = () => {
    if (typeof request.key !== "string") throw invalid(`"${String(request.op)}" needs a string "key"`);
    return request.key;
  };
  switch (request.op as ChannelRequest["op"]) {
    case "get":
      return storage.get(key());
    case "put":
      return storage.put(key(), request.value);
    case "delete":
      return storage.delete(key());
    case "list": {
      const options: ListOptions = {
        prefix: optional(request.prefix, "string", "prefix") as string | undefined,
        limit: optional(request.limit, "number", "limit") as number | undefined,
        cursor: optional(request.cursor, "string", "cursor") as string | undefined,
      };
      return storage.list(options);
    }
    case "setAlarm":
      // Checked there: a time that is no finite number is AlarmInvalid.
      return alarms.set(object, request.at as number);
    case "getAlarm":
      return alarms.get(object);
    case "deleteAlarm":
      return alarms.delete(object);
    default:
      throw invalid(`no operation ${JSON.stringify(String(request.op)).slice(0, 80)} on the object channel`);
  }
}

// The instance's half of the object channel: the context an object's code gets (`ctx`), whose
// storage and alarm calls become requests on the channel the host opened, answered by id. At
// most `MAX_IN_FLIGHT` are sent at once (the rest wait here); a failure the host answers is
// thrown to the object's code as an ObjectError with its `_tag`, message and status.
import type { Socket } from "node:net";
import type { ObjectContext, StoredList, StoredListOptions } from "../object.ts";
import { CHANNEL_CLOSED, lineReader, MAX_IN_FLIGHT, type ChannelAnswer, type ChannelOp } from "./channel.ts";
import { ObjectError } from "./errors.ts";
import { checkedKey, valueJson } from "./values.ts";

/** Longest answer line read from the host (a list page of large values is long; the host is trusted). */
const ANSWER_LINE_BYTES = 512 * 1024 * 1024;

const channelClosed = (message: string) => new ObjectError(CHANNEL_CLOSED, 503, message);

/** The channel of one instance: at most one open at a time, all for the one object it was first opened for. */
export interface InstanceChannel {
  /** The object's name, once a channel was opened; "" before. */
  readonly name: string;
  /** Takes an upgraded socket as the channel (closing an earlier one); false when it names another object. */
  accept(socket: Socket, head: Buffer, name: string): boolean;
  /** Closes the open channel, if any (its requests reject). */
  close(): void;
  readonly context: ObjectContext;
}

interface Pending {
  resolve(value: unknown): void;
  reject(err: Error): void;
}

export function instanceChannel(): InstanceChannel {
  let name = "";
  let socket: Socket | undefined;
  let nextId = 0;
  const pending = new Map<number, Pending>();
  const waiting: Array<() => void> = [];

  const release = () => {
    while (waiting.length > 0 && pending.size < MAX_IN_FLIGHT) waiting.shift()!();
  };
  const settle = (answer: ChannelAnswer) => {
    const entry = pending.get(answer.id);
    if (!entry) return;
    pending.delete(answer.id);
    release();
    if (answer.ok) entry.resolve(answer.value);
    else {
      const { _tag, message, status } = answer.error;
      entry.reject(new ObjectError(String(_tag), Number.isInteger(status) ? (status as number) : 500, String(message)));
    }
  };
  const closed = (of: Socket) => {
    if (socket !== of) return;
    socket = undefined;
    const failure = channelClosed(
      "the object's storage channel closed before the host answered (a write may or may not have been made)",
    );
    for (const entry of pending.values()) entry.reject(failure);
    pending.clear();
    release();
  };

  /** Sends one request (`fields` is the JSON of its fields after `id` and `op`, with a leading comma). */
  const send = async (op: ChannelOp, fields = ""): Promise<unknown> => {
    while (socket && pending.size >= MAX_IN_FLIGHT) await new Promise<void>((resolve) => waiting.push(resolve));
    const open = socket;
    if (!open)
      throw channelClosed("no storage channel is open: storage and alarms work only while the host holds this object");
    const id = nextId++;
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject });
      open.write(`{"id":${id},"op":"${op}"${fields}}\n`);
    });
  };
  const field = (key: string, value: unknown) => (value === undefined ? "" : `,"${key}":${JSON.stringify(value)}`);

  const context: ObjectContext = {
    get name() {
      return name;
    },
    storage: {
      get: async <T>(key: string) => (await send("get", field("key", checkedKey(key)))) as T | undefined,
      put: async (key, value) => {
        await send("put", `${field("key", checkedKey(key))},"value":${valueJson(value)}`);
      },
      delete: async (key) => (await send("delete", field("key", checkedKey(key)))) === true,
      list: async (options: StoredListOptions = {}) => {
        const fields =
          field("prefix", options.prefix) + field("limit", options.limit) + field("cursor", options.cursor);
        return listOf(await send("list", fields));
      },
    },
    setAlarm: async (epochMs) => (await send("setAlarm", field("at", epochMs))) as number,
    getAlarm: async () => ((await send("getAlarm")) as number | null | undefined) ?? null,
    deleteAlarm: async () => {
      await send("deleteAlarm");
    },
  };

  return {
    get name() {
      return name;
    },
    context,
    accept(upgraded, head, objectName) {
      if (name !== "" && name !== objectName) return false;
      name = objectName;
      const earlier = socket;
      if (earlier) {
        closed(earlier);
        earlier.destroy();
      }
      socket = upgraded;
      const read = lineReader(
        ANSWER_LINE_BYTES,
        (line) => answered(line, settle),
        () => upgraded.destroy(),
      );
      upgraded.setNoDelay(true);
      upgraded.on("data", read);
      upgraded.on("error", () => upgraded.destroy());
      // The server's sockets allow half-open: the host's end is the channel's.
      upgraded.once("end", () => upgraded.destroy());
      upgraded.once("close", () => closed(upgraded));
      if (head.length > 0) read(head);
      return true;
    },
    close() {
      socket?.destroy();
    },
  };
}

function answered(line: string, settle: (answer: ChannelAnswer) => void): void {
  let answer: ChannelAnswer;
  try {
    answer = JSON.parse(line) as ChannelAnswer;
  } catch {
    return;
  }
  if (typeof answer === "object" && answer !== null && typeof answer.id === "number") settle(answer);
}

function listOf(page: unknown): StoredList {
  const { items, cursor } = (page ?? {}) as { items?: unknown; cursor?: unknown };
  const list = (Array.isArray(items) ? items : []) as StoredList;
  return typeof cursor === "string" ? Object.assign(list, { cursor }) : list;
}

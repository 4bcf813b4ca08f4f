// The runtime's object mode, loaded only for an image made by `defineObject`: the channel the
// host opens by an Upgrade (objects/channel.ts), methods called with the object's context first,
// and `POST /__object__/alarm` running the alarm handler, answered as the RPC wire answers.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { MethodDefinition } from "../image.ts";
import type { ObjectImage } from "../object.ts";
import { CHANNEL_PATH, CHANNEL_PROTOCOL, MAX_OBJECT_NAME_CHARS, OBJECT_NAME_HEADER } from "../objects/channel.ts";
import { instanceChannel } from "../objects/channel-instance.ts";
import { readBody, sendJson } from "../wire/http-util.ts";
import { declaredStatus, encodeThrown, errorEnvelope } from "../wire/rpc.ts";

export interface ObjectMode {
  /** Calls a method's handler with the object's context before the call's arguments. */
  invoke(definition: MethodDefinition, args: unknown[]): unknown;
  /** Takes an Upgrade request as the object channel, or refuses it (403 when it lacks the secret). */
  acceptChannel(req: IncomingMessage, socket: Socket, head: Buffer, admitted: boolean): void;
  serveAlarm(req: IncomingMessage, res: ServerResponse): Promise<void>;
  /** Closes the channel (the runtime stops listening, or exits). */
  close(): void;
}

/** Largest body an alarm request may carry (it carries none). */
const ALARM_BODY_LIMIT = 1024;

export function createObjectMode(image: ObjectImage): ObjectMode {
  const channel = instanceChannel();
  const ctx = channel.context;
  return {
    invoke: (definition, args) => definition.handler(ctx, ...args),
    acceptChannel(req, socket, head, admitted) {
      socket.on("error", () => socket.destroy());
      if (!admitted) return refuse(socket, 403, "Forbidden");
      const name = channelName(req);
      if (name === undefined) return refuse(socket, 400, "Bad Request");
      if (!channel.accept(socket, head, name)) return refuse(socket, 409, "Conflict");
      socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${CHANNEL_PROTOCOL}\r\n\r\n`);
    },
    async serveAlarm(req, res) {
      if (req.method !== "POST")
        return sendJson(res, 405, errorEnvelope({ _tag: "RpcMethodNotAllowed", message: "an alarm runs by POST" }), {
          allow: "POST",
        });
      await readBody(req, ALARM_BODY_LIMIT).catch(() => undefined);
      const { alarm } = image;
      if (!alarm)
        return sendJson(
          res,
          404,
          errorEnvelope({ _tag: "ObjectAlarmNotFound", message: "the object has no alarm handler" }),
        );
      try {
        await alarm(ctx);
      } catch (thrown) {
        return sendJson(res, declaredStatus(thrown), errorEnvelope(encodeThrown(thrown)));
      }
      sendJson(res, 200, null);
    },
    close: () => channel.close(),
  };
}

/** The object's name an Upgrade request for the channel carries; undefined when it is not one. */
function channelName(req: IncomingMessage): string | undefined {
  if (req.method !== "GET" || req.url !== CHANNEL_PATH) return undefined;
  if (req.headers.upgrade?.toLowerCase() !== CHANNEL_PROTOCOL) return undefined;
  const header = req.headers[OBJECT_NAME_HEADER];
  if (typeof header !== "string") return undefined;
  try {
    const name = decodeURIComponent(header);
    return name.length >= 1 && name.length <= MAX_OBJECT_NAME_CHARS ? name : undefined;
  } catch {
    return undefined;
  }
}

/** Answers an Upgrade that is not taken, and closes its socket. */
function refuse(socket: Socket, status: number, reason: string): void {
  socket.end(`HTTP/1.1 ${status} ${reason}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
}

// Requests Node's HTTP parser rejects before any route sees them (a raw non-ASCII byte in the
// URL, a malformed header, too many header bytes, a request too slow to arrive) answered as
// JSON with a `_tag` like every other error, instead of Node's bare status line.
import type { Socket } from "node:net";
import { decodeFailure, RequestHeaderFieldsTooLarge, RequestTimeout } from "../schemas/index.ts";

const REASONS: Record<number, string> = {
  400: "Bad Request",
  408: "Request Timeout",
  431: "Request Header Fields Too Large",
};

/** The `clientError` listener of an API server. */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket): void {
  // Nothing to answer on a socket the client already closed or that carries an answer.
  if (error.code === "ECONNRESET" || !socket.writable || (socket as Socket & { _httpMessage?: unknown })._httpMessage) {
    socket.destroy();
    return;
  }
  const { status, body } = answerFor(error.code);
  const json = JSON.stringify(body);
  socket.end(
    `HTTP/1.1 ${status} ${REASONS[status]}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(json)}\r\nconnection: close\r\n\r\n${json}`,
  );
}

function answerFor(code: string | undefined): { status: number; body: object } {
  if (code === "HPE_HEADER_OVERFLOW") {
    return { status: 431, body: RequestHeaderFieldsTooLarge.make({ message: "request headers are too large" }).body };
  }
  if (code === "ERR_HTTP_REQUEST_TIMEOUT") {
    return { status: 408, body: RequestTimeout.make({ message: "the request did not arrive in time" }).body };
  }
  const message = "malformed HTTP request (characters outside ASCII in the URL must be percent-encoded)";
  return { status: 400, body: decodeFailure([], message).body };
}

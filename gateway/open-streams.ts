// The answers that stay open (followed reads, long polls), by the API key that opened them: a
// key removed from the key file (SIGHUP) ends them at once. A stream under way gets a last
// `{"error": …}` line, as when a read fails; an answer not yet begun is the 401 of a removed key.
import type { ServerResponse } from "node:http";
import { UNAUTHORIZED_MESSAGES, Unauthorized } from "../schemas/index.ts";
import { sendError } from "./respond.ts";

export interface OpenStreams {
  /** Holds `res` under `keyId` until it closes: the signal aborts when that key is revoked. */
  hold(keyId: string, res: ServerResponse): AbortSignal;
  /** Ends every answer held under these keys; returns how many. */
  revoke(keyIds: readonly string[]): number;
}

export function openStreams(): OpenStreams {
  const byKey = new Map<string, Map<ServerResponse, AbortController>>();
  return {
    hold(keyId, res) {
      const ended = new AbortController();
      let held = byKey.get(keyId);
      if (!held) byKey.set(keyId, (held = new Map()));
      held.set(res, ended);
      res.once("close", () => {
        held.delete(res);
        if (held.size === 0 && byKey.get(keyId) === held) byKey.delete(keyId);
      });
      return ended.signal;
    },
    revoke(keyIds) {
      let ended = 0;
      for (const keyId of keyIds) {
        const held = byKey.get(keyId);
        byKey.delete(keyId);
        for (const [res, controller] of held ?? []) {
          controller.abort();
          endRevoked(res);
          ended += 1;
        }
      }
      return ended;
    },
  };
}

function endRevoked(res: ServerResponse): void {
  if (res.writableEnded) return;
  const refusal = Unauthorized.make({ message: UNAUTHORIZED_MESSAGES.revoked });
  if (!res.headersSent) {
    res.setHeader("www-authenticate", "Bearer");
    sendError(res, refusal);
  } else {
    res.end(`{"error":${JSON.stringify(refusal.body)}}\n`);
  }
}

// What a gateway does when its key file loses keys (SIGHUP): it ends the answers those keys
// hold open here, and records the keys for the microVM hosts, whose proxies then refuse the
// tokens asked for with them. The record is tried again while NATS cannot take it.
import { log, recordRevocations, type NatsHandle } from "../platform/index.ts";
import type { ReloadableApiKeys } from "./api-keys.ts";
import type { OpenStreams } from "./open-streams.ts";

/** Tries to record a revocation this often, this many times (a NATS away for a minute). */
const RETRY_MS = 1_000;
const ATTEMPTS = 60;

export function revokeOnReload(keys: ReloadableApiKeys, nats: NatsHandle, streams: OpenStreams): void {
  keys.onRevoked((keyIds) => {
    const at = Date.now();
    const ended = streams.revoke(keyIds);
    log.info({ revokedKeys: keyIds.length, endedAnswers: ended }, "API keys revoked: what they held open ended");
    void record(nats, keyIds, at);
  });
}

async function record(nats: NatsHandle, keyIds: readonly string[], at: number): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await recordRevocations(nats.requester, keyIds, at);
      log.info({ revokedKeys: keyIds.length }, "API key revocations recorded: microVM proxies refuse their tokens");
      return;
    } catch (err) {
      if (attempt === ATTEMPTS) {
        log.error(
          { err, revokedKeys: keyIds.length },
          "API key revocations not recorded: microVM proxies still take their tokens (send SIGHUP again once NATS is back)",
        );
        return;
      }
      if (attempt === 1) log.warn({ err }, "API key revocations not recorded yet: trying again");
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  }
}

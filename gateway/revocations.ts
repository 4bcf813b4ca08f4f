// What a gateway does when its key file loses keys (SIGHUP): it ends the answers those keys
// hold open here, and records the keys for the microVM hosts, whose proxies then refuse the
// tokens asked for with them. The record is tried again, every second, until NATS takes it.
import { log, recordRevocations, type NatsHandle } from "../platform/index.ts";
import type { ReloadableApiKeys } from "./api-keys.ts";
import type { OpenStreams } from "./open-streams.ts";

/** Tries to record a revocation again this often while NATS cannot take it. */
const RETRY_MS = 1_000;
/** After this many attempts the failure is logged as an error (the tries go on). */
const ATTEMPTS_BEFORE_ERROR = 60;

export function revokeOnReload(keys: ReloadableApiKeys, nats: NatsHandle, streams: OpenStreams): void {
  keys.onRevoked((keyIds) => {
    const at = Date.now();
    const ended = streams.revoke(keyIds);
    log.info({ revokedKeys: keyIds.length, endedAnswers: ended }, "API keys revoked: what they held open ended");
    void record(nats, keyIds, at);
  });
}

async function record(nats: NatsHandle, keyIds: readonly string[], at: number): Promise<void> {
  for (let attempt = 1; !nats.nc.isClosed(); attempt++) {
    try {
      await recordRevocations(nats.requester, keyIds, at);
      log.info({ revokedKeys: keyIds.length }, "API key revocations recorded: microVM proxies refuse their tokens");
      return;
    } catch (err) {
      if (attempt === 1) log.warn({ err }, "API key revocations not recorded yet: trying again every second");
      if (attempt === ATTEMPTS_BEFORE_ERROR)
        log.error(
          { err, revokedKeys: keyIds.length },
          "API key revocations still not recorded: microVM proxies still take their tokens (trying on)",
        );
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  }
}

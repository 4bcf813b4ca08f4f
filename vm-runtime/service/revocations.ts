// The API keys revoked since a token was issued, as this host knows them: read before it
// serves, then every second (`watchRevocations`); a change cuts the proxied requests under way
// whose token it revokes, and the proxies refuse those tokens from then on.
import type { NatsConnection } from "@nats-io/transport-node";
import { Requester, watchRevocations } from "../../platform/index.ts";
import type { RevokedCheck } from "../host/token-cache.ts";
import type { HostedInstance } from "./hosted.ts";

export interface HostRevocations {
  /** Whether a token's API key was revoked since it was issued. */
  readonly revoked: RevokedCheck;
  /** From now on, each change cuts the revoked requests under way at these instances' proxies. */
  cutAt(instances: () => Iterable<HostedInstance>): void;
  close(): void;
}

export async function hostRevocations(nc: NatsConnection, everyMs?: number): Promise<HostRevocations> {
  const requester = new Requester(nc);
  const watch = await watchRevocations(requester, everyMs).catch((err: unknown) => {
    requester.close();
    throw err;
  });
  return {
    revoked: (claims) => watch.revoked(claims.akid, claims.iat),
    cutAt(instances) {
      watch.onChange(() => {
        for (const hosted of instances()) hosted.instance.proxy.endRevoked();
      });
    },
    close() {
      watch.close();
      requester.close();
    },
  };
}

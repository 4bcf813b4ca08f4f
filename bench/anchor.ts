// The no-hop anchor's side in the bench (the server itself is anchor-server.ts): its own nkey
// login on the main stack's nats-server, allowed its bucket only as the actors' user is theirs,
// and the environment its process starts with.
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import * as nkeys from "@nats-io/nkeys";
import { kvOwn, publicKeyOf, type NkeyUser } from "../platform/index.ts";

/** The anchor's bucket: its own, beside the service's `tasks`. */
export const anchorBucket = "anchor_tasks";
const inboxPrefix = "_INBOX_anchor";

/** The anchor's generated user: its seed file (0600, beside the roles' seeds) and its server entry. */
export interface AnchorLogin {
  seedFile: string;
  user: NkeyUser;
}

export async function anchorLogin(authDir: string): Promise<AnchorLogin> {
  const seed = new TextDecoder().decode(nkeys.createUser().getSeed());
  const seedFile = join(authDir, "anchor.nk");
  await mkdir(authDir, { recursive: true, mode: 0o700 });
  await writeFile(seedFile, `${seed}\n`, { mode: 0o600 });
  const permissions = {
    // What a user's own server would hold: its bucket's reads and writes, and making that bucket
    // (the service's roles may not make streams; the anchor is not one of them).
    publish: {
      allow: [
        ...kvOwn(anchorBucket),
        `$JS.API.STREAM.CREATE.KV_${anchorBucket}`,
        `$JS.API.STREAM.UPDATE.KV_${anchorBucket}`,
        "$JS.API.INFO",
      ],
    },
    subscribe: { allow: [`${inboxPrefix}.>`] },
  };
  return { seedFile, user: { nkey: publicKeyOf(seed), permissions } };
}

/** anchor-server.ts's settings: the NATS it joins and how, and its bucket. */
export function anchorEnv(natsUrl: string, login: AnchorLogin): Record<string, string> {
  return { NATS_URL: natsUrl, NATS_NKEY: login.seedFile, NATS_INBOX_PREFIX: inboxPrefix, ANCHOR_BUCKET: anchorBucket };
}

// The NATS `authorization {}` block of compose.yaml's nodes, with the same per-role permissions
// as the generated config of `npm start`, but users with passwords taken from the environment
// (`NATS_<ROLE>_PASSWORD`, set in `.env`). Not kept in the repository: `npm install` and
// `npm run cluster` write cluster/nats-auth.conf from the contracts (`tsx cluster/compose-auth.ts
// [file]` too; `-` prints it).
import { randomBytes } from "node:crypto";
import { readFile, rename, writeFile } from "node:fs/promises";
import { fileURLToPath, pathToFileURL } from "node:url";
import { inboxPrefixOf, natsRoles, rolePermissions, type NatsRole } from "../platform/index.ts";

/** The environment variable holding `role`'s password (compose interpolates it from `.env`). */
export const passwordVariable = (role: NatsRole | "route") => `NATS_${role.toUpperCase()}_PASSWORD`;

export function composeAuthorization(prefix = ""): string {
  const permissions = rolePermissions(prefix);
  const users = natsRoles.map(
    // Unquoted `$VAR`: nats-server reads it from its environment.
    (role) =>
      `    { user: "${role}", password: $${passwordVariable(role)}, permissions: ` +
      `${JSON.stringify(permissions[role])} }`,
  );
  return [
    "# Written by `npm install`, `npm run cluster` or `tsx cluster/compose-auth.ts`: edit platform/nats-auth.ts " +
      "instead.",
    `# Each role connects as NATS_USER=<role> with ` +
      `NATS_INBOX_PREFIX=${inboxPrefixOf("gateway").replace("gateway", "<role>")}.`,
    "authorization {",
    "  users = [",
    ...users,
    "  ]",
    "}",
    "",
  ].join("\n");
}

/** Where compose.yaml's nodes read their users from. */
export const composeAuthPath = fileURLToPath(new URL("nats-auth.conf", import.meta.url));

/**
 * Writes the compose nodes' users to `path` (default cluster/nats-auth.conf) unless it holds
 * them already; whole or not at all (a node starting meanwhile never reads half a file).
 */
export async function writeComposeAuthorization(path = composeAuthPath): Promise<void> {
  const text = composeAuthorization();
  if ((await readFile(path, "utf8").catch(() => undefined)) === text) return;
  const partial = `${path}.${randomBytes(4).toString("hex")}.tmp`;
  await writeFile(partial, text);
  await rename(partial, path);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const target = process.argv[2];
  if (target === "-") process.stdout.write(composeAuthorization());
  else await writeComposeAuthorization(target);
}

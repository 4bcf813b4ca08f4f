// The lines of the API keys file (`API_KEYS_FILE`): `<principal> <sha256 hex of the key>`. The
// gateway reads them, `taskctl apikey create` writes one; neither side holds the other's code.
import { createHash, randomBytes } from "node:crypto";

/** Principal names: no `:`, so none can pass for a NATS principal (`nats:<user>`). */
export const API_KEY_PRINCIPAL = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/;

export const sha256Hex = (text: string) => createHash("sha256").update(text).digest("hex");

/** A new random key for `principal` and the line that grants it (`taskctl apikey create`). */
export function newApiKey(principal: string): { key: string; line: string } {
  if (!API_KEY_PRINCIPAL.test(principal))
    throw new Error("a principal is 1-64 of letters, digits, . _ @ - (starting with a letter or digit)");
  const key = `tsk_${randomBytes(32).toString("base64url")}`;
  return { key, line: `${principal} ${sha256Hex(key)}` };
}

// The `Host` check every API makes, on loopback too: a browser page whose own name an attacker
// rebinds to 127.0.0.1 sends its name as `Host` (DNS rebinding), so only known names are served.

/** Names every API answers to, with any port: `localhost`, `127.0.0.1`, `[::1]`. */
export const LOOPBACK_HOST_NAMES: readonly string[] = ["localhost", "127.0.0.1", "::1"];

/** `name[:port]` or `[v6][:port]`; anything else names no host. */
const HOST_HEADER = /^(?:\[([0-9a-f:.]+)\]|([^:[\]]*))(?::\d*)?$/;

/** The host name of a `Host` header, lower-cased, without its port (`[::1]:80` → `::1`); "" when malformed. */
export function hostNameOf(header: string | undefined): string {
  const match = HOST_HEADER.exec((header ?? "").trim().toLowerCase());
  const name = match ? (match[1] ?? match[2] ?? "") : "";
  // `localhost.` is the same name as `localhost`.
  return name.endsWith(".") ? name.slice(0, -1) : name;
}

/**
 * A test of `Host` headers against the loopback names plus `names` (bare names or addresses,
 * `[v6]` or `v6`), with any port.
 */
export function hostCheck(names: readonly string[] = []): (header: string | undefined) => boolean {
  const bare = names.map((name) =>
    name
      .trim()
      .toLowerCase()
      .replace(/^\[(.*)\]$/, "$1")
      .replace(/\.$/, ""),
  );
  const allowed = new Set([...LOOPBACK_HOST_NAMES, ...bare.filter(Boolean)]);
  // A client sends the same header on every request: the verdicts of the latest few are kept.
  const seen = new Map<string, boolean>();
  return (header) => {
    if (header === undefined) return false;
    let verdict = seen.get(header);
    if (verdict === undefined) {
      verdict = allowed.has(hostNameOf(header));
      if (seen.size >= SEEN_HEADERS) seen.clear();
      seen.set(header, verdict);
    }
    return verdict;
  };
}

/** Host headers whose verdict is kept (a caller's name, with and without a port, and a few more). */
const SEEN_HEADERS = 64;
